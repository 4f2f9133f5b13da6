// The row operations (rowops.inc) compiled for -mavx2.
#define DAISY_ROWOPS_NS avx2
#define DAISY_ROWOPS_LANES 8
#include "rowops.inc"
