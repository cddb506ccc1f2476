//! LD_PRELOAD system-call offload for unmodified programs.
