// The row operations (rowops.inc) compiled for -mavx2.
#define DAISY_ROWOPS_NS avx2
#include "rowops.inc"
