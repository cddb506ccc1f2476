//! The C API called from Rust: outcomes of correct use and of each misuse.
use std::ffi::{c_void, CStr};
use std::ptr;

use corehop::*;

fn last_error() -> String {
    // SAFETY: corehop_last_error never returns NULL, and its string lives for sixteen more
    // failures on this thread.
    unsafe { CStr::from_ptr(corehop_last_error()) }.to_string_lossy().into_owned()
}

// One test: the C API has one process-wide state.
#[test]
fn lifecycle_and_misuse() {
    let a = [0u8; 64];
    let obj = a.as_ptr() as *const c_void;

    assert_eq!(ct_start(obj), -1);
    assert!(last_error().contains("not started"), "{}", last_error());
    assert_eq!(corehop_shutdown(), -1);

    assert_eq!(corehop_init(), 0, "{}", last_error());
    assert_eq!(corehop_init(), -1);
    assert!(last_error().contains("already started"));

    assert_eq!(ct_end(), -1);
    assert!(last_error().contains("no operation open"));
    assert_eq!(ct_start(ptr::null()), -1);
    assert!(last_error().contains("NULL"));

    assert_eq!(ct_object(obj, 64), 0);
    assert_eq!(ct_object(obj, 64), -1);
    assert!(last_error().contains("already registered"), "{}", last_error());
    assert_eq!(ct_where(obj), -1, "a new object runs where the caller is");
    assert_eq!(ct_where(ptr::null()), -2);

    assert_eq!(ct_start(obj), 0);
    assert_eq!(ct_start(obj), -1, "operations do not nest");
    assert!(last_error().contains("already has an operation open"));
    assert_eq!(ct_end(), 0);

    // Undeclared objects are added at their first ct_start.
    let b = [0u8; 8];
    assert_eq!(ct_start(b.as_ptr() as *const c_void), 0);
    assert_eq!(ct_end(), 0);
    let (mut local, mut core) = (0usize, 0usize);
    // SAFETY: valid out-pointers or NULL.
    assert_eq!(unsafe { corehop_census(&mut local, &mut core, ptr::null_mut(), ptr::null_mut()) }, 0);
    assert_eq!(local + core, 2);

    // Shutting down with an operation open: ct_end still releases it and reports the shutdown.
    assert_eq!(ct_start(obj), 0);
    assert_eq!(corehop_shutdown(), 0);
    assert_eq!(ct_end(), -1);
    assert!(last_error().contains("shut down"));

    // Restartable, and the old objects are forgotten.
    assert_eq!(corehop_init(), 0);
    assert_eq!(ct_where(obj), -2);
    assert_eq!(corehop_shutdown(), 0);
}

#[test]
fn an_error_message_outlives_the_failures_after_it() {
    // C leaves open whether `corehop_last_error()` is read before or after the failing call
    // beside it in one argument list: an earlier message must still be readable.
    std::thread::spawn(|| {
        assert_eq!(ct_end(), -1);
        let first = corehop_last_error();
        for _ in 0..15 {
            assert_eq!(ct_end(), -1);
        }
        // SAFETY: fifteen failures later the first message is still kept.
        let text = unsafe { CStr::from_ptr(first) }.to_string_lossy().into_owned();
        assert!(text.contains("no operation open"), "{text}");
    })
    .join()
    .unwrap();
}
