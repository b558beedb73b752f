/*
 * tests/plugins/common_train.h — what the training fixtures share: the SDK
 * (ABI 1.1) and nothing else; each fixture is built like a real plugin.
 */
#ifndef KILN_TEST_COMMON_TRAIN_H
#define KILN_TEST_COMMON_TRAIN_H
#include "kiln/kiln.h"
#endif
