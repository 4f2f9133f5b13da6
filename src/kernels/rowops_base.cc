// The row operations (rowops.inc) compiled for the baseline ISA (any x86-64 or arm64).
#define DAISY_ROWOPS_NS base
#include "rowops.inc"
