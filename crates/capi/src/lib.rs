//! C API to the corehop runtime: `include/corehop.h`, built as `libcorehop.so`.
//!
//! The O² paper's annotations, `ct_start(obj)` / `ct_end()`, over the runtime's object
//! registry ([`corehop_runtime::objects`]). An object is identified by its address (it is never
//! dereferenced); the registry holds no data for it, only its lock, route and counters.
//!
//! State: one process-wide registry (behind a lock, replaced by `corehop_init` and dropped by
//! `corehop_shutdown`) and, per C thread, the operation it has open. A C thread is a plain OS
//! thread that moves itself with `sched_setaffinity` and never hops between OS threads, so a
//! thread-local is the right home for its open operation. Errors are reported C-style: `-1` and
//! a per-thread message from `corehop_last_error`.
#![warn(missing_docs)]
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::{Arc, RwLock};

use corehop_runtime::objects::{Objects, ObjectsConfig, Operation, Placement};
use corehop_topology::{CpuId, Machine};

/// Bytes assumed for objects `ct_start` adds without a `ct_object` declaration
/// (`COREHOP_DEFAULT_OBJECT_BYTES` in the header).
pub const DEFAULT_OBJECT_BYTES: u64 = 4096;

struct State {
    machine: Machine,
    objects: Objects<usize, ()>,
}

static STATE: RwLock<Option<Arc<State>>> = RwLock::new(None);

/// The operation a thread has open, with the registry it belongs to. Dropped with the thread
/// if the thread exits (or is cancelled) between `ct_start` and `ct_end`: the operation is
/// then ended, so the object's lock is not held forever by a thread that no longer exists,
/// and the program is told on stderr (its data may be half-changed, as after a crash inside
/// a mutex).
struct Open {
    state: Arc<State>,
    op: Option<Operation<()>>,
    obj: usize,
}

impl Open {
    fn end(mut self) -> Arc<State> {
        if let Some(op) = self.op.take() {
            self.state.objects.end(op);
        }
        Arc::clone(&self.state)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.state.objects.end(op);
            let line = format!(
                "corehop: a thread exited with an operation open on {:#x} (no ct_end); its lock was released\n",
                self.obj
            );
            // SAFETY: write(2) reads `line` only; stderr may be closed, then nothing is said.
            unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
        }
    }
}

thread_local! {
    static OPEN: RefCell<Option<Open>> = const { RefCell::new(None) };
    /// This thread's last [`KEPT_ERRORS`] messages, the newest last.
    static LAST_ERRORS: RefCell<VecDeque<CString>> = const { RefCell::new(VecDeque::new()) };
}

/// How many failures on a thread a message outlives: `corehop_last_error()` read as an
/// argument beside the failing call (`printf("%d %s", ct_start(o), corehop_last_error())`,
/// whose order C leaves open) must not point at a message already freed.
const KEPT_ERRORS: usize = 16;

fn fail(message: impl std::fmt::Display) -> c_int {
    let text = CString::new(message.to_string().replace('\0', " ")).expect("NULs were replaced");
    LAST_ERRORS.with(|e| {
        let mut kept = e.borrow_mut();
        if kept.len() == KEPT_ERRORS {
            kept.pop_front();
        }
        kept.push_back(text);
    });
    -1
}

fn state() -> Option<Arc<State>> {
    STATE.read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn start_scheduler() -> Result<State, String> {
    let machine = corehop_topology::discover().map_err(|e| format!("discovering this machine: {e}"))?;
    let cpus: Vec<CpuId> = machine.cpus().iter().map(|c| c.id).collect();
    let objects = Objects::new(&machine, &cpus, ObjectsConfig::default()).map_err(|e| e.to_string())?;
    Ok(State { machine, objects })
}

/// Starts the object scheduler on every CPU this process may use.
#[no_mangle]
pub extern "C" fn corehop_init() -> c_int {
    let mut slot = STATE.write().unwrap_or_else(|e| e.into_inner());
    if slot.is_some() {
        return fail("corehop_init: already started (call corehop_shutdown first)");
    }
    match start_scheduler() {
        Ok(state) => {
            *slot = Some(Arc::new(state));
            0
        }
        Err(e) => fail(format!("corehop_init: {e}")),
    }
}

/// Stops the object scheduler and forgets every object.
#[no_mangle]
pub extern "C" fn corehop_shutdown() -> c_int {
    match STATE.write().unwrap_or_else(|e| e.into_inner()).take() {
        Some(_) => 0,
        None => fail("corehop_shutdown: corehop is not started"),
    }
}

/// Declares `obj` and the bytes its operations touch.
#[no_mangle]
pub extern "C" fn ct_object(obj: *const c_void, bytes: usize) -> c_int {
    let Some(state) = state() else { return fail("ct_object: corehop is not started (call corehop_init)") };
    if obj.is_null() {
        return fail("ct_object: obj is NULL");
    }
    match state.objects.register(obj as usize, (), bytes as u64) {
        Ok(_) => 0,
        Err(e) => fail(format!("ct_object({obj:p}): {e}")),
    }
}

/// Starts an operation on `obj` where it lives; takes its lock.
#[no_mangle]
pub extern "C" fn ct_start(obj: *const c_void) -> c_int {
    let Some(state) = state() else { return fail("ct_start: corehop is not started (call corehop_init)") };
    if obj.is_null() {
        return fail("ct_start: obj is NULL");
    }
    if OPEN.with(|o| o.borrow().is_some()) {
        return fail(format!(
            "ct_start({obj:p}): this thread already has an operation open (call ct_end first)"
        ));
    }
    let key = obj as usize;
    let handle = match state.objects.handle(&key) {
        Some(h) => h,
        None => match state.objects.register(key, (), DEFAULT_OBJECT_BYTES) {
            Ok(h) => h,
            // Another thread added it in between.
            Err(_) => match state.objects.handle(&key) {
                Some(h) => h,
                None => return fail(format!("ct_start({obj:p}): could not add the object")),
            },
        },
    };
    match state.objects.start(&handle) {
        Ok(op) => {
            OPEN.with(|o| *o.borrow_mut() = Some(Open { state, op: Some(op), obj: key }));
            0
        }
        Err(e) => fail(format!("ct_start({obj:p}): {e}")),
    }
}

/// Ends this thread's open operation.
#[no_mangle]
pub extern "C" fn ct_end() -> c_int {
    let Some(open) = OPEN.with(|o| o.borrow_mut().take()) else {
        return fail("ct_end: this thread has no operation open (call ct_start first)");
    };
    // The lock is released even if corehop was shut down meanwhile: the registry the operation
    // started in is still alive through `state`.
    let state = open.end();
    match self::state() {
        Some(now) if Arc::ptr_eq(&now, &state) => 0,
        _ => fail("ct_end: corehop was shut down while the operation was open"),
    }
}

/// The kernel CPU number `obj` is scheduled on, -1 for "where the caller is", -2 if unknown.
#[no_mangle]
pub extern "C" fn ct_where(obj: *const c_void) -> c_int {
    let Some(state) = state() else {
        fail("ct_where: corehop is not started (call corehop_init)");
        return -2;
    };
    match state.objects.placement(&(obj as usize)) {
        Some(Placement::Core { owner }) => state.machine.cpus()[owner.0].os_id.0 as c_int,
        Some(_) => -1,
        None => {
            fail(format!("ct_where({obj:p}): unknown object"));
            -2
        }
    }
}

/// Counts of objects by placement; NULL pointers are skipped.
///
/// # Safety
/// Each pointer is NULL or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn corehop_census(
    local: *mut usize,
    core: *mut usize,
    domain: *mut usize,
    replicated: *mut usize,
) -> c_int {
    let Some(state) = state() else {
        return fail("corehop_census: corehop is not started (call corehop_init)");
    };
    let c = state.objects.census();
    for (ptr, value) in [(local, c.local), (core, c.core), (domain, c.domain), (replicated, c.replicated)] {
        // SAFETY: the caller guarantees each pointer is NULL or valid for one write.
        if let Some(out) = unsafe { ptr.as_mut() } {
            *out = value;
        }
    }
    0
}

/// Why the last failing call on this thread failed.
#[no_mangle]
pub extern "C" fn corehop_last_error() -> *const c_char {
    // The CString lives in this thread's LAST_ERRORS for KEPT_ERRORS more failures on this
    // thread, as the header documents; "no error" is static.
    LAST_ERRORS.with(|e| e.borrow().back().map_or(c"no error".as_ptr(), |m| m.as_ptr()))
}
