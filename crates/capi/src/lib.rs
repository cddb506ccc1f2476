//! C API to the corehop runtime.
