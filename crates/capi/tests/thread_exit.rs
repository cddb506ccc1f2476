//! A thread that exits between `ct_start` and `ct_end` must not leave its object locked:
//! another thread's `ct_start` on it then succeeds instead of spinning forever.
use std::ffi::c_void;
use std::sync::mpsc;
use std::time::Duration;

use corehop::*;

#[test]
fn an_operation_left_open_by_an_exiting_thread_is_ended() {
    assert_eq!(corehop_init(), 0);
    let object = Box::leak(Box::new([0u8; 64])).as_ptr() as usize;
    std::thread::spawn(move || {
        assert_eq!(ct_start(object as *const c_void), 0);
        // The thread ends here without ct_end.
    })
    .join()
    .unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let started = ct_start(object as *const c_void);
        let ended = ct_end();
        let _ = done.send((started, ended));
    });
    // Far longer than a ct_start takes; a lock left held never returns.
    let outcome = finished.recv_timeout(Duration::from_secs(20));
    assert_eq!(outcome, Ok((0, 0)), "ct_start on an object whose operation's thread exited did not return");
    assert_eq!(corehop_shutdown(), 0);
}
