//! The live corehop runtime on Linux.
#![deny(unsafe_op_in_unsafe_fn)]
