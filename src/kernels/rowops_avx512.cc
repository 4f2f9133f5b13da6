// The row operations (rowops.inc) compiled for -mavx512f -mavx512bw -mavx512vl.
#define DAISY_ROWOPS_NS avx512
#define DAISY_ROWOPS_LANES 16
#include "rowops.inc"
