/*
 * kiln/kiln.h — umbrella header of the kiln SDK: the plugin ABI (plugin.h),
 * typed values (value.h), status codes (status.h), tensors (tensor.h), the
 * training ops and events (training.h, ABI 1.1) and the author helpers
 * (sdk.h). A plugin author includes this one file; optimizer plugins may
 * also include kiln/optim_util.h (header-only helpers, not ABI).
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H
#include "kiln/plugin.h"
#include "kiln/sdk.h"
#include "kiln/status.h"
#include "kiln/tensor.h"
#include "kiln/training.h"
#include "kiln/value.h"
#endif
