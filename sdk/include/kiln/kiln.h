/*
 * kiln/kiln.h — umbrella header of the kiln SDK: the plugin ABI (plugin.h),
 * typed values (value.h), status codes (status.h) and the author helpers
 * (sdk.h). A plugin author includes this one file.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H
#include "kiln/plugin.h"
#include "kiln/sdk.h"
#include "kiln/status.h"
#include "kiln/value.h"
#endif
