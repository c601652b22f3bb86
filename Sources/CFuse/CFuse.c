// The shim is all inline (include/CFuse.h); a C target needs one source file.
#include "CFuse.h"
