//! corehop's own variables, out of the program's sight and back in its children's.
//!
//! `corehop run --offload` starts a program with `LD_PRELOAD` and its settings (`COREHOP_*`,
//! sometimes `ASAN_OPTIONS`) changed, and with [`MARKER`] saying what each of those held
//! before: its value, or nothing. Run plainly, the program would see those values, and a
//! program that prints or passes on its environment would print or pass on different bytes.
//! So the preload code (the start-up stub, or the library where it is preloaded itself) takes
//! corehop's values out of the environment in a constructor, before `main`, and puts the
//! values from before back in their places ([`Hidden::hide`]). It keeps corehop's values for
//! the library's settings ([`Hidden::setting`]) and for every program the process starts: the
//! exec wrappers ([`crate::exec_wrappers!`]) give a child the environment its parent passed with
//! corehop's variables added back and a marker of its own ([`Hidden::for_child`]), so the child
//! runs under corehop and sees what its parent gave it.
//!
//! What stays visible: `/proc/PID/environ` (the kernel's copy of what the process started
//! with); a child started by a raw `execve` system call gets the environment as the program
//! sees it, and runs without corehop.
//!
//! Only `core`, no allocation and no panicking path: the stub (`no_std`, which cannot unwind)
//! includes this file by path.

use core::cell::UnsafeCell;
use core::ffi::c_char;
use core::sync::atomic::{AtomicBool, Ordering};

/// The variable that says what `corehop run` changed: a comma-separated list of the names it
/// changed, each followed by `=LEN:VALUE` if it had a value before (LEN bytes of it).
pub const MARKER: &str = "COREHOP_ENV_WAS";

/// With this variable set, at any value, the dynamic loader lists the libraries a program
/// would load, preloads included, and does not run it (how `ldd` works): a child given it
/// gets the environment as the program passed it, without corehop, so that the list is the
/// plain one.
pub const LOADER_TRACE: &str = "LD_TRACE_LOADED_OBJECTS";

/// Whether `program` (a path or file name), given the words `args` after its own name, is
/// the dynamic loader asked to describe rather than run a program (`ld.so --list PROGRAM`,
/// `--verify`, `--list-tunables`, `--list-diagnostics`): what it prints names what is
/// preloaded, so it starts as it does plainly, without corehop.
pub fn loader_describes<'a>(program: &[u8], args: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let name = program.rsplit(|&b| b == b'/').next().unwrap_or(program);
    if !(starts(name, b"ld-linux") || starts(name, b"ld.so") || starts(name, b"ld64.so")) {
        return false;
    }
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg {
            b"--list" | b"--verify" | b"--list-tunables" | b"--list-diagnostics" => return true,
            // The loader's options that take a value.
            b"--library-path"
            | b"--inhibit-rpath"
            | b"--audit"
            | b"--preload"
            | b"--argv0"
            | b"--glibc-hwcaps-prepend"
            | b"--glibc-hwcaps-mask" => {
                args.next();
            }
            // The program's name: the words after it are its own.
            _ if !starts(arg, b"--") => return false,
            _ => {}
        }
    }
    false
}

/// [`loader_describes`] of a start of the program at `program` with the words `argv`.
///
/// # Safety
///
/// `program` is null or NUL-terminated; `argv` is null or a null-terminated array of
/// NUL-terminated strings, unchanged while this runs.
pub unsafe fn start_describes(program: *const c_char, argv: *const *const c_char) -> bool {
    if program.is_null() {
        return false;
    }
    // SAFETY: the contract; `map_while` stops at the terminating null, so no index passes it
    // (the name, `argv[0]`, is read first for the same reason).
    let args = unsafe { entry_at(argv, 0) }.map(|_| (1..).map_while(|i| unsafe { entry_at(argv, i) }));
    // SAFETY: the contract.
    loader_describes(unsafe { c_bytes(program) }, args.into_iter().flatten())
}

/// Bytes a [`Hidden`] keeps corehop's entries and the values from before in.
const BYTES: usize = 4096;
/// Variables a marker may name.
const MAX_NAMES: usize = 16;
/// A child's environment is built on the stack of the call that starts it, in at most this
/// many entries and [`CHILD_BYTES`] bytes of new text; a larger one is passed on as the
/// program gave it, and the child runs without corehop.
const CHILD_ENTRIES: usize = 512;
const CHILD_BYTES: usize = 2048;

/// Where a piece of text sits in [`Block::bytes`].
#[repr(C)]
#[derive(Clone, Copy)]
struct Span {
    start: u16,
    len: u16,
}

/// A span or none, laid out the same in the stub and the library (an `Option`'s layout is
/// the compiler's to choose).
#[repr(C)]
#[derive(Clone, Copy)]
struct MaybeSpan {
    span: Span,
    set: bool,
}

impl MaybeSpan {
    const NONE: MaybeSpan = MaybeSpan { span: Span { start: 0, len: 0 }, set: false };

    fn get(self) -> Option<Span> {
        self.set.then_some(self.span)
    }
}

impl From<Option<Span>> for MaybeSpan {
    fn from(span: Option<Span>) -> MaybeSpan {
        span.map_or(MaybeSpan::NONE, |span| MaybeSpan { span, set: true })
    }
}

/// A variable `corehop run` changed.
#[repr(C)]
#[derive(Clone, Copy)]
struct Changed {
    name: Span,
    /// `NAME=VALUE` as corehop set it, followed by a NUL (if it set one).
    ours: MaybeSpan,
    /// `NAME=VALUE` as it was before, followed by a NUL (if it had one).
    before: MaybeSpan,
}

impl Changed {
    const NONE: Changed =
        Changed { name: Span { start: 0, len: 0 }, ours: MaybeSpan::NONE, before: MaybeSpan::NONE };

    fn ours(&self) -> Option<Span> {
        self.ours.get()
    }

    fn before(&self) -> Option<Span> {
        self.before.get()
    }
}

/// The text last: a hide writes the other fields and the start of `bytes` (a few hundred
/// bytes), and in the stub they then share the page the loader wrote already. With `bytes`
/// first, the rest fell on a page of its own, whose first touch cost a process under `corehop
/// run` two page faults, about 10 µs here (docs/performance.md, "Sixtieth session").
#[repr(C)]
struct Block {
    count: usize,
    used: usize,
    changed: [Changed; MAX_NAMES],
    bytes: [u8; BYTES],
}

/// What a process hid of its environment. Filled once, by [`Hidden::hide`] in a constructor
/// (before any other thread), then only read. `repr(C)`: the stub hands its own to the
/// library, which is built from this file separately.
#[repr(C)]
pub struct Hidden {
    ready: AtomicBool,
    block: UnsafeCell<Block>,
}

// SAFETY: `block` is written only by `hide`, which its contract confines to one thread before
// any other exists, and published by `ready` (release); readers look at it only after seeing
// `ready` (acquire).
unsafe impl Sync for Hidden {}

impl Default for Hidden {
    fn default() -> Hidden {
        Hidden::new()
    }
}

impl Hidden {
    /// Nothing hidden yet.
    pub const fn new() -> Hidden {
        Hidden {
            ready: AtomicBool::new(false),
            block: UnsafeCell::new(Block {
                bytes: [0; BYTES],
                used: 0,
                changed: [Changed::NONE; MAX_NAMES],
                count: 0,
            }),
        }
    }

    /// Whether this process started under `corehop run` and hid its variables: only then does
    /// a child need them back.
    pub fn is_hiding(&self) -> bool {
        self.block().is_some()
    }

    fn block(&self) -> Option<&Block> {
        // SAFETY: once `ready` is seen set, nothing writes the block again (see `Sync`).
        self.ready.load(Ordering::Acquire).then(|| unsafe { &*self.block.get() })
    }

    /// Takes corehop's variables out of the environment `envp` (the process's initial
    /// `environ`), as [`MARKER`] lists them, and puts the values from before back in their
    /// places; the marker goes too. If the marker cannot be read or what it names does not fit,
    /// only the marker goes: the program then sees corehop's variables, and its children get
    /// them as it passes them.
    ///
    /// # Safety
    ///
    /// Once per process, from a constructor, before any other thread runs and before anything
    /// reads the environment through `envp`'s array; `envp` is null or that array (writable,
    /// null-terminated, of NUL-terminated strings).
    pub unsafe fn hide(&self, envp: *mut *mut c_char) {
        if envp.is_null() || self.ready.load(Ordering::Relaxed) {
            return;
        }
        let envp_const = envp as *const *const c_char;
        let mut marker = None;
        let mut count = 0;
        // Names only, here and below: the values, most of an environment's bytes, are read
        // only of the variables corehop changed.
        // SAFETY: `envp` is a null-terminated array of C strings (the contract).
        unsafe {
            while let Some(name) = name_at(envp_const, count) {
                if same(name, MARKER.as_bytes()) {
                    marker = Some(count);
                }
                count += 1;
            }
        }
        let Some(marker) = marker else { return };
        // SAFETY: the contract: nothing else touches the block yet.
        let block = unsafe { &mut *self.block.get() };
        // SAFETY: `marker < count`, an entry of the array.
        let value = value_of(unsafe { entry_at(envp_const, marker) }.unwrap_or(&[]));
        let ok = block.read_marker(value)
            // SAFETY: as above.
            && (0..count).all(|i| match unsafe { name_at(envp_const, i) }.and_then(|name| block.find(name)) {
                // SAFETY: as above.
                Some(k) => block.keep_ours(k, || unsafe { entry_at(envp_const, i) }.unwrap_or(&[])),
                None => true,
            });
        let mut kept = 0;
        let mut shown = [false; MAX_NAMES];
        for i in 0..count {
            // SAFETY: `i < count`, and `kept <= i`: entries move down, never past one unread.
            unsafe {
                let entry = *envp.add(i);
                let keep = if i == marker {
                    None
                } else if !ok {
                    Some(entry)
                } else {
                    match name_at(envp_const, i).and_then(|name| block.find(name)) {
                        None => Some(entry),
                        // The value from before, at the first entry of the name; later
                        // entries of it go.
                        Some(k) if !shown[k] => {
                            shown[k] = true;
                            block.changed[k]
                                .before()
                                .map(|s| block.bytes.as_mut_ptr().add(s.start.into()) as *mut c_char)
                        }
                        Some(_) => None,
                    }
                };
                if let Some(entry) = keep {
                    *envp.add(kept) = entry;
                    kept += 1;
                }
            }
        }
        // A variable corehop took away comes back at the end, where there is room (at least
        // the marker's).
        if ok {
            for (changed, shown) in block.changed.iter().zip(shown).take(block.count) {
                if let (Some(before), false, true) = (changed.before(), shown, kept < count) {
                    // SAFETY: `kept < count`, a slot of the array.
                    unsafe {
                        *envp.add(kept) = block.bytes.as_mut_ptr().add(before.start.into()) as *mut c_char
                    };
                    kept += 1;
                }
            }
        }
        // SAFETY: `kept <= count`: the terminating null moves down with the entries.
        unsafe { *envp.add(kept) = core::ptr::null_mut() };
        self.ready.store(ok, Ordering::Release);
    }

    /// corehop's value of `name` (without the NUL that follows it in memory), if it hid one.
    pub fn setting(&self, name: &[u8]) -> Option<&[u8]> {
        let block = self.block()?;
        Some(block.value(block.changed.get(block.find(name)?)?.ours()?))
    }

    /// corehop's value of `name`, NUL-terminated, if it hid one.
    pub fn setting_c(&self, name: &[u8]) -> Option<*const c_char> {
        self.setting(name).map(|value| value.as_ptr() as *const c_char)
    }

    /// Runs `start` with the environment a child started with `envp` gets: `envp` with
    /// corehop's variables added back (appended to the child's `LD_PRELOAD` and
    /// `ASAN_OPTIONS`, unless they hold it already; in place of its `COREHOP_*`) and a marker
    /// of what `envp` held. `envp` itself if nothing was hidden, if it carries a marker already
    /// (it comes from `corehop run`), if it names one of corehop's variables twice, or if the
    /// result does not fit (more than 511 variables, or 2 KiB of new text).
    ///
    /// # Safety
    ///
    /// `envp` is null or a null-terminated array of NUL-terminated strings, unchanged while this
    /// runs. Only the stack is written: this may run in a `vfork` child.
    pub unsafe fn for_child<R>(
        &self,
        envp: *const *const c_char,
        start: impl FnOnce(*const *const c_char) -> R,
    ) -> R {
        let mut entries = [core::ptr::null::<c_char>(); CHILD_ENTRIES];
        let mut text = [0u8; CHILD_BYTES];
        // SAFETY: the contract.
        start(unsafe { self.child_env(envp, &mut entries, &mut text) })
    }

    /// The environment [`Hidden::for_child`] starts a child with, built in `entries` and
    /// `text` (or `envp` itself). One copy for all the wrappers: not generic, not inlined.
    ///
    /// # Safety
    ///
    /// As [`Hidden::for_child`].
    #[inline(never)]
    unsafe fn child_env(
        &self,
        envp: *const *const c_char,
        entries: &mut [*const c_char; CHILD_ENTRIES],
        text: &mut [u8; CHILD_BYTES],
    ) -> *const *const c_char {
        let Some(block) = self.block() else { return envp };
        // SAFETY: the contract.
        match unsafe { block.child(envp, entries, text) } {
            Some(()) => entries.as_ptr(),
            None => envp,
        }
    }
}

/// Appends to `out` (through `push`) the marker item for `name` with the value it had before
/// (`None`: unset), preceded by a comma unless it is the first.
pub fn marker_item(first: bool, name: &[u8], before: Option<&[u8]>, mut push: impl FnMut(&[u8])) {
    if !first {
        push(b",");
    }
    push(name);
    if let Some(value) = before {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut n = value.len();
        loop {
            at -= 1;
            if let Some(d) = digits.get_mut(at) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || at == 0 {
                break;
            }
        }
        push(b"=");
        push(digits.get(at..).unwrap_or(&[]));
        push(b":");
        push(value);
    }
}

impl Block {
    fn text(&self, span: Span) -> &[u8] {
        let start = usize::from(span.start);
        self.bytes.get(start..start + usize::from(span.len)).unwrap_or(&[])
    }

    /// `VALUE` of the `NAME=VALUE` and NUL at `span`.
    fn value(&self, span: Span) -> &[u8] {
        let value = value_of(self.text(span));
        value.split_last().map_or(value, |(_, value)| value)
    }

    fn find(&self, name: &[u8]) -> Option<usize> {
        self.changed.get(..self.count)?.iter().position(|c| same(self.text(c.name), name))
    }

    /// Copies `pieces` in one after another; their span, or none if they do not fit.
    fn put(&mut self, pieces: &[&[u8]]) -> Option<Span> {
        let start = append(&mut self.bytes, &mut self.used, pieces)?;
        Some(Span { start: u16::try_from(start).ok()?, len: u16::try_from(self.used - start).ok()? })
    }

    /// Reads the marker's list into `changed`; false if it is malformed or too long.
    fn read_marker(&mut self, mut list: &[u8]) -> bool {
        while !list.is_empty() {
            let end = list.iter().position(|&b| b == b',' || b == b'=').unwrap_or(list.len());
            let (Some(name), Some(rest)) = (list.get(..end), list.get(end..)) else { return false };
            if name.is_empty() || !name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_') {
                return false;
            }
            let (before, rest) = match rest.split_first() {
                Some((b'=', rest)) => {
                    let colon = rest.iter().position(|&b| b == b':').unwrap_or(rest.len());
                    let Some(len) = rest.get(..colon).and_then(decimal) else { return false };
                    let Some(value) = rest.get(colon + 1..).and_then(|r| r.get(..len)) else { return false };
                    (Some(value), rest.get(colon + 1 + len..).unwrap_or(&[]))
                }
                _ => (None, rest),
            };
            list = match rest.split_first() {
                None => &[],
                Some((b',', rest)) if !rest.is_empty() => rest,
                _ => return false,
            };
            if self.count >= MAX_NAMES || self.find(name).is_some() {
                return false;
            }
            let Some(name_span) = self.put(&[name]) else { return false };
            let before = match before {
                Some(value) => match self.put(&[name, b"=", value, b"\0"]) {
                    Some(span) => Some(span),
                    None => return false,
                },
                None => None,
            };
            let Some(slot) = self.changed.get_mut(self.count) else { return false };
            *slot = Changed { name: name_span, ours: MaybeSpan::NONE, before: before.into() };
            self.count += 1;
        }
        true
    }

    /// Keeps `entry` (`NAME=VALUE`, read only if needed) as corehop's value of the `k`th name
    /// of the marker, if it is the first entry of it; false if it does not fit.
    fn keep_ours<'e>(&mut self, k: usize, entry: impl FnOnce() -> &'e [u8]) -> bool {
        if self.changed.get(k).is_some_and(|c| c.ours().is_some()) {
            return true;
        }
        let Some(span) = self.put(&[entry(), b"\0"]) else { return false };
        if let Some(changed) = self.changed.get_mut(k) {
            changed.ours = Some(span).into();
        }
        true
    }

    /// What corehop added to `name`'s value before: the part of its value after the one from
    /// before and a colon, or all of it if there was none. `None`: corehop's value replaces
    /// the child's (its own variables, or one it did not just add to).
    fn addition(&self, changed: &Changed) -> Option<&[u8]> {
        let name = self.text(changed.name);
        if starts(name, b"COREHOP_") {
            return None;
        }
        let ours = self.value(changed.ours()?);
        match changed.before().map(|s| self.value(s)) {
            None => Some(ours),
            Some(before) => {
                if before.is_empty() {
                    Some(ours)
                } else if ours.len() > before.len() + 1
                    && starts(ours, before)
                    && ours.get(before.len()) == Some(&b':')
                {
                    ours.get(before.len() + 1..)
                } else {
                    None
                }
            }
        }
    }

    /// Fills `entries` and `text` with a child's environment (see [`Hidden::for_child`]).
    ///
    /// # Safety
    ///
    /// As [`Hidden::for_child`].
    unsafe fn child(
        &self,
        envp: *const *const c_char,
        entries: &mut [*const c_char; CHILD_ENTRIES],
        text: &mut [u8; CHILD_BYTES],
    ) -> Option<()> {
        // Written only through `base`, so that the pointers handed out stay valid.
        let base = text.as_mut_ptr();
        let mut used = 0usize;
        // Copies pieces into `text`; where they start.
        let mut put = |pieces: &[&[u8]]| -> Option<*const c_char> {
            // SAFETY: `base` is `text`'s, `CHILD_BYTES` long, and nothing else uses `text`.
            let buf = unsafe { core::slice::from_raw_parts_mut(base, CHILD_BYTES) };
            let start = append(buf, &mut used, pieces)?;
            // SAFETY: `start <= used <= CHILD_BYTES`, within `text`.
            Some(unsafe { base.add(start) } as *const c_char)
        };
        let mut count = 0;
        let mut push = |entry: *const c_char| -> Option<()> {
            *entries.get_mut(count)? = entry;
            count += 1;
            Some(())
        };
        let mut passed: [Option<&[u8]>; MAX_NAMES] = [None; MAX_NAMES];
        let mut i = 0;
        // SAFETY: `envp` is null or a null-terminated array of C strings (the contract).
        while let Some(entry) = unsafe { entry_at(envp, i) } {
            let name = name_of(entry);
            // The marker: an environment `corehop run` made itself. The loader's trace
            // variable (`ldd`): the child only lists its libraries, and would list ours.
            if same(name, MARKER.as_bytes()) || same(name, LOADER_TRACE.as_bytes()) {
                return None;
            }
            match self.find(name) {
                None => push(entry.as_ptr() as *const c_char)?,
                Some(k) if passed.get(k).is_some_and(Option::is_none) => {
                    let changed = self.changed.get(k)?;
                    let value = value_of(entry);
                    *passed.get_mut(k)? = Some(value);
                    if let Some(ours) = changed.ours() {
                        match self.addition(changed) {
                            None => push(self.text(ours).as_ptr() as *const c_char)?,
                            Some(add) if contains(value, add) => push(entry.as_ptr() as *const c_char)?,
                            Some(add) if value.is_empty() => push(put(&[name, b"=", add, b"\0"])?)?,
                            Some(add) => push(put(&[name, b"=", value, b":", add, b"\0"])?)?,
                        }
                    }
                }
                // A name given twice: which one a reader takes is its own business (the
                // loader takes the last `LD_PRELOAD`, `getenv` the first), so the child gets
                // the environment as given, and runs without corehop.
                Some(_) => return None,
            }
            i += 1;
        }
        for (changed, passed) in self.changed.get(..self.count)?.iter().zip(passed) {
            if let (Some(ours), None) = (changed.ours(), passed) {
                match self.addition(changed) {
                    None => push(self.text(ours).as_ptr() as *const c_char)?,
                    Some(add) => push(put(&[self.text(changed.name), b"=", add, b"\0"])?)?,
                }
            }
        }
        let start = put(&[MARKER.as_bytes(), b"="])?;
        let mut fits = true;
        for (k, (changed, passed)) in self.changed.get(..self.count)?.iter().zip(passed).enumerate() {
            marker_item(k == 0, self.text(changed.name), passed, |piece| fits &= put(&[piece]).is_some());
        }
        if !fits {
            return None;
        }
        put(&[b"\0"])?;
        push(start)?;
        push(core::ptr::null())
    }
}

/// Copies `pieces` one after another into `buf` from `*used` on, moving `*used` past them;
/// where they start, or none if they do not fit (the caller then gives the buffer up).
fn append(buf: &mut [u8], used: &mut usize, pieces: &[&[u8]]) -> Option<usize> {
    let start = *used;
    for piece in pieces {
        let end = used.checked_add(piece.len())?;
        for (to, from) in buf.get_mut(*used..end)?.iter_mut().zip(piece.iter()) {
            *to = *from;
        }
        *used = end;
    }
    Some(start)
}

/// The entry at `i` of a null-terminated array of C strings, without its NUL; `None` at the
/// end (or if `envp` is null).
///
/// # Safety
///
/// `envp` is null or such an array with at least `i` entries before its null, whose strings
/// outlive `'a`.
unsafe fn entry_at<'a>(envp: *const *const c_char, i: usize) -> Option<&'a [u8]> {
    if envp.is_null() {
        return None;
    }
    // SAFETY: the contract: `i` is at most the index of the terminating null.
    let entry = unsafe { *envp.add(i) };
    // SAFETY: a non-null entry is a NUL-terminated string.
    (!entry.is_null()).then(|| unsafe { c_bytes(entry) })
}

/// The name of the entry at `i` (`NAME` of `NAME=VALUE`), read up to its `=` only: empty
/// for an entry without one, which names no variable (`getenv` passes it by); `None` at the
/// end (or if `envp` is null).
///
/// # Safety
///
/// As for [`entry_at`].
unsafe fn name_at<'a>(envp: *const *const c_char, i: usize) -> Option<&'a [u8]> {
    if envp.is_null() {
        return None;
    }
    // SAFETY: the contract: `i` is at most the index of the terminating null.
    let entry = unsafe { *envp.add(i) };
    if entry.is_null() {
        return None;
    }
    let mut len = 0;
    let end = loop {
        // SAFETY: every byte up to the NUL is part of the string; volatile as in `c_bytes`.
        match unsafe { entry.add(len).read_volatile() } as u8 {
            0 => break 0,
            b'=' => break len,
            _ => len += 1,
        }
    };
    // SAFETY: `end` bytes from `entry` are the string's.
    Some(unsafe { core::slice::from_raw_parts(entry as *const u8, end) })
}

/// The bytes of a NUL-terminated string, without the NUL. Volatile reads: the compiler turns
/// a plain loop into a call of `strlen`, one more name the stub would bind in every process
/// (the strings are a few dozen bytes, read once a start or an exec).
///
/// # Safety
///
/// `s` is a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn c_bytes<'a>(s: *const c_char) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: every byte up to the NUL is part of the string.
    while unsafe { s.add(len).read_volatile() } != 0 {
        len += 1;
    }
    // SAFETY: `len` bytes from `s` are the string's.
    unsafe { core::slice::from_raw_parts(s as *const u8, len) }
}

/// `NAME` of `NAME=VALUE` (empty without `=`: as [`name_at`]).
fn name_of(entry: &[u8]) -> &[u8] {
    let end = entry.iter().position(|&b| b == b'=').unwrap_or(0);
    entry.get(..end).unwrap_or(&[])
}

/// `VALUE` of `NAME=VALUE` (empty without `=`).
fn value_of(entry: &[u8]) -> &[u8] {
    match entry.iter().position(|&b| b == b'=') {
        Some(at) => entry.get(at + 1..).unwrap_or(&[]),
        None => &[],
    }
}

/// Whether `a` and `b` hold the same bytes. By hand, as the rest: slice comparison calls
/// libc's `memcmp` or `bcmp`, one more name the stub would bind in every process.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && starts(a, b)
}

/// Whether `s` starts with `prefix`.
fn starts(s: &[u8], prefix: &[u8]) -> bool {
    s.len() >= prefix.len() && s.iter().zip(prefix).all(|(x, y)| x == y)
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    (0..=hay.len().saturating_sub(needle.len()))
        .any(|i| hay.get(i..).is_some_and(|rest| starts(rest, needle)))
}

/// A decimal number of at most nine digits.
fn decimal(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    digits.iter().try_fold(0usize, |n, &d| d.is_ascii_digit().then(|| n * 10 + usize::from(d - b'0')))
}

/// Defines this object's constructor (`.init_array`), which hides corehop's variables into
/// `$hidden` (a `&'static Hidden`) before `main` if `corehop run` left its marker. glibc
/// passes a constructor the environment; a set-user-ID process (`secure_getenv` finds
/// nothing) keeps its environment as it came.
#[macro_export]
macro_rules! hide_at_start {
    ($hidden:expr) => {
        /// The constructor: a look for `corehop run`'s marker, and the hiding.
        #[used]
        #[link_section = ".init_array"]
        static HIDE_AT_START: unsafe extern "C" fn(
            core::ffi::c_int,
            *mut *mut core::ffi::c_char,
            *mut *mut core::ffi::c_char,
        ) = hide_at_start;

        /// # Safety
        /// Called once, by the dynamic loader, with the process's environment, before `main`
        /// (or, for an object opened later, with no marker left to find).
        unsafe extern "C" fn hide_at_start(
            _argc: core::ffi::c_int,
            _argv: *mut *mut core::ffi::c_char,
            envp: *mut *mut core::ffi::c_char,
        ) {
            extern "C" {
                fn secure_getenv(name: *const core::ffi::c_char) -> *const core::ffi::c_char;
            }
            let hidden = &$hidden;
            // SAFETY: the name is NUL-terminated.
            if !unsafe { secure_getenv(c"COREHOP_ENV_WAS".as_ptr()) }.is_null() {
                // SAFETY: the loader runs constructors before `main`, on the one thread
                // there is.
                unsafe { hidden.hide(envp) };
            }
        }
    };
}

/// Exports the exec family (`execve`, `execv`, `execvp`, `execvpe`, `execl`, `execlp`,
/// `execle`, `fexecve`, `execveat`, `posix_spawn`, `posix_spawnp`), `system` and `popen`
/// (with `pclose` and `fclose`): each starts its program with the environment
/// [`Hidden::for_child`] makes of the one it was given (or of `environ`). `$hidden`: this object's `&'static Hidden`; `$next`: the path of a
/// `fn(&'static [u8]) -> usize` giving libc's function of a NUL-terminated name (0: none);
/// `$plainly` (optional): the path of an `unsafe fn(*const c_char) -> bool` told of every
/// start, with the path or file name of the program (null if none is given), that says
/// whether to start it plainly instead, with the environment as given (`crate::lifetimes`).
/// The dynamic loader asked to describe a program starts plainly either way
/// ([`start_describes`]).
/// x86-64: `execl`, `execlp` and `execle` are variadic, which Rust cannot define; each is a
/// naked function that lays its arguments out as the array they are.
#[macro_export]
macro_rules! exec_wrappers {
    ($hidden:expr, $next:path) => {
        /// No record of how programs end: each starts under corehop.
        unsafe fn no_record_of_lifetimes(_program: *const core::ffi::c_char) -> bool {
            false
        }
        $crate::exec_wrappers!($hidden, $next, super::no_record_of_lifetimes);
    };
    ($hidden:expr, $next:path, $plainly:path) => {
        /// The exec family, starting children under corehop (`hidden_env`).
        mod exec_wrappers {
            use core::ffi::{c_char, c_int, c_void};
            use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

            type Argv = *const *const c_char;
            type Exec = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
            type Spawn = unsafe extern "C" fn(
                *mut c_int,
                *const c_char,
                *const c_void,
                *const c_void,
                Argv,
                Argv,
            ) -> c_int;
            const ENOSYS: c_int = 38;
            const E2BIG: c_int = 7;

            extern "C" {
                static environ: Argv;
                fn __errno_location() -> *mut c_int;
            }

            /// libc's function of `name`, looked up at its first use; `None` if libc has none.
            fn real<F: Copy>(cache: &AtomicUsize, name: &'static [u8]) -> Option<F> {
                let mut found = cache.load(Relaxed);
                if found == 0 {
                    found = $next(name);
                    cache.store(found, Relaxed);
                }
                // SAFETY: `F` is the type of libc's function of that name, a pointer in size.
                (found != 0).then(|| unsafe { core::mem::transmute_copy::<usize, F>(&found) })
            }

            fn no_such_function() -> c_int {
                // SAFETY: the calling thread's errno.
                unsafe { *__errno_location() = ENOSYS };
                -1
            }

            /// Whether an exec failed because its arguments and environment did not fit.
            fn exec_too_big(result: &c_int) -> bool {
                // SAFETY: the calling thread's errno.
                *result == -1 && unsafe { *__errno_location() } == E2BIG
            }

            /// Whether a spawn failed because its arguments and environment did not fit.
            fn spawn_too_big(result: &c_int) -> bool {
                *result == E2BIG
            }

            /// Calls libc's function `name` (of type `F`, looked up once into `cache`) through
            /// `call`, with the environment a child started with `envp` gets, or with `envp`
            /// as given if the program at `program` with the words `argv` starts plainly;
            /// `missing()` if libc has none. If the variables added back made the start too
            /// big for the kernel (`too_big`), starts it again with `envp` as given, as it
            /// starts plainly: the child then runs without corehop rather than not at all.
            ///
            /// # Safety
            /// `envp` and `argv` as `Hidden::for_child` takes an environment; `program` is null
            /// or NUL-terminated; `call` makes the call its caller's contract allows.
            #[allow(clippy::too_many_arguments)]
            unsafe fn through<F: Copy, R>(
                cache: &AtomicUsize,
                name: &'static [u8],
                program: *const c_char,
                argv: Argv,
                envp: Argv,
                missing: impl FnOnce() -> R,
                too_big: fn(&R) -> bool,
                call: impl Fn(F, Argv) -> R,
            ) -> R {
                let Some(next) = real::<F>(cache, name) else { return missing() };
                // SAFETY: `program` and `argv` as the contract says.
                if unsafe { $plainly(program) || $crate::hidden_env::start_describes(program, argv) } {
                    return call(next, envp);
                }
                let hidden = &$hidden;
                // SAFETY: the caller's contract; `for_child` passes an environment of the same kind.
                let (out, added) = unsafe { hidden.for_child(envp, |child| (call(next, child), child != envp)) };
                if added && too_big(&out) {
                    call(next, envp)
                } else {
                    out
                }
            }

            /// libc's `execve` and `execvpe`, once looked up.
            static EXECVE: AtomicUsize = AtomicUsize::new(0);
            static EXECVPE: AtomicUsize = AtomicUsize::new(0);

            /// Looks up libc's `execve` and `execvpe` with `lookup` (0: not found) before a
            /// `fork`: each child of a shell execs, and looking them up there cost each one
            /// the walk of the loader's list.
            #[allow(dead_code)]
            pub fn look_up_before_fork(lookup: fn(&'static [u8]) -> usize) {
                for (cache, name) in [(&EXECVE, &b"execve\0"[..]), (&EXECVPE, &b"execvpe\0"[..])] {
                    if cache.load(Relaxed) == 0 {
                        let found = lookup(name);
                        if found != 0 {
                            cache.store(found, Relaxed);
                        }
                    }
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
                // SAFETY: the caller's contract (each wrapper below: the same).
                unsafe {
                    through(&EXECVE, b"execve\0", path, argv, envp, no_such_function, exec_too_big, |next: Exec, envp| {
                        next(path, argv, envp)
                    })
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
                // SAFETY: as for `execve`.
                unsafe {
                    through(&EXECVPE, b"execvpe\0", file, argv, envp, no_such_function, exec_too_big, |next: Exec, envp| {
                        next(file, argv, envp)
                    })
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
                // SAFETY: `environ` is the process's environment, as libc's `execv` passes it.
                unsafe { execve(path, argv, environ) }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
                // SAFETY: as for `execv`.
                unsafe { execvpe(file, argv, environ) }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                type F = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
                // SAFETY: as for `execve`.
                unsafe {
                    through(&REAL, b"fexecve\0", core::ptr::null(), argv, envp, no_such_function, exec_too_big, |next: F, envp| next(fd, argv, envp))
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn execveat(
                dirfd: c_int,
                path: *const c_char,
                argv: Argv,
                envp: Argv,
                flags: c_int,
            ) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                type F = unsafe extern "C" fn(c_int, *const c_char, Argv, Argv, c_int) -> c_int;
                // SAFETY: as for `execve`.
                unsafe {
                    through(&REAL, b"execveat\0", path, argv, envp, no_such_function, exec_too_big, |next: F, envp| {
                        next(dirfd, path, argv, envp, flags)
                    })
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn posix_spawn(
                pid: *mut c_int,
                path: *const c_char,
                actions: *const c_void,
                attributes: *const c_void,
                argv: Argv,
                envp: Argv,
            ) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                // SAFETY: as for `execve`.
                unsafe {
                    through(
                        &REAL,
                        b"posix_spawn\0",
                        path,
                        argv,
                        envp,
                        || ENOSYS,
                        spawn_too_big,
                        |next: Spawn, envp| next(pid, path, actions, attributes, argv, envp),
                    )
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn posix_spawnp(
                pid: *mut c_int,
                file: *const c_char,
                actions: *const c_void,
                attributes: *const c_void,
                argv: Argv,
                envp: Argv,
            ) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                // SAFETY: as for `execve`.
                unsafe {
                    through(
                        &REAL,
                        b"posix_spawnp\0",
                        file,
                        argv,
                        envp,
                        || ENOSYS,
                        spawn_too_big,
                        |next: Spawn, envp| next(pid, file, actions, attributes, argv, envp),
                    )
                }
            }

            /// glibc's `struct sigaction` on x86-64.
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct SigAction {
                handler: usize,
                mask: SigSet,
                flags: c_int,
                restorer: usize,
            }
            /// glibc's `sigset_t`: bit `n - 1` of the first word for signal `n`.
            type SigSet = [u64; 16];
            /// glibc's `posix_spawnattr_t` (336 bytes on x86-64), filled by libc alone.
            #[repr(C, align(8))]
            struct SpawnAttr([u8; 336]);
            type Sigaction = unsafe extern "C" fn(c_int, *const SigAction, *mut SigAction) -> c_int;

            const SIG_IGN: usize = 1;
            const SIGINT: c_int = 2;
            const SIGQUIT: c_int = 3;
            const SIGCHLD: c_int = 17;
            const SIG_BLOCK: c_int = 0;
            const SIG_SETMASK: c_int = 2;
            const EINTR: isize = 4;
            const SYS_WAIT4: isize = 61;
            const SYS_GETPID: isize = 39;
            const SPAWN_SETSIGDEF: i16 = 0x04;
            const SPAWN_SETSIGMASK: i16 = 0x08;
            const IGNORE: SigAction = SigAction { handler: SIG_IGN, mask: [0; 16], flags: 0, restorer: 0 };

            extern "C" {
                fn sigprocmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
                fn posix_spawnattr_init(attr: *mut SpawnAttr) -> c_int;
                fn posix_spawnattr_destroy(attr: *mut SpawnAttr) -> c_int;
                fn posix_spawnattr_setsigmask(attr: *mut SpawnAttr, set: *const SigSet) -> c_int;
                fn posix_spawnattr_setsigdefault(attr: *mut SpawnAttr, set: *const SigSet) -> c_int;
                fn posix_spawnattr_setflags(attr: *mut SpawnAttr, flags: i16) -> c_int;
                fn sched_yield() -> c_int;
                fn gnu_get_libc_version() -> *const c_char;
            }

            /// Whether this glibc's `system` ends the shell's options with `--` (from 2.38 on).
            fn ends_options() -> bool {
                // SAFETY: glibc returns a static NUL-terminated string such as "2.36".
                let version = unsafe { core::ffi::CStr::from_ptr(gnu_get_libc_version()) }.to_bytes();
                let mut parts = version.split(|&b| b == b'.').map(|part| {
                    part.iter().take_while(|b| b.is_ascii_digit()).fold(0u32, |n, &d| {
                        n.saturating_mul(10).saturating_add(u32::from(d - b'0'))
                    })
                });
                let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
                (major, minor) >= (2, 38)
            }

            /// A value one thread at a time uses: a lock that yields the CPU while it waits,
            /// held for a few system calls, `popen`'s start of its shell the longest (the
            /// stub has no `std` for a `Mutex`).
            /// The lock word is the pid of the process whose thread holds it: in a child that
            /// `fork` made while another thread held it, no thread will release it, so a
            /// thread of another process than the holder's takes it over (glibc resets its
            /// `popen` lock in such a child too).
            struct Locked<T> {
                holder: core::sync::atomic::AtomicI32,
                value: core::cell::UnsafeCell<T>,
            }
            // SAFETY: `value` is reached only through `Locked::with`, while the lock is held.
            unsafe impl<T: Send> Sync for Locked<T> {}

            impl<T> Locked<T> {
                const fn new(value: T) -> Locked<T> {
                    Locked {
                        holder: core::sync::atomic::AtomicI32::new(0),
                        value: core::cell::UnsafeCell::new(value),
                    }
                }

                /// Runs `f` on the value, alone.
                fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
                    use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
                    // A system call, not libc's `getpid`: the callers start processes, which
                    // costs far more.
                    let me = raw3(SYS_GETPID, 0, 0, 0) as i32;
                    let mut seen = 0;
                    while let Err(holder) = self.holder.compare_exchange(seen, me, Acquire, Relaxed) {
                        if holder != 0 && holder != me {
                            // Held in the process this one was forked from: take it over.
                            seen = holder;
                            continue;
                        }
                        seen = 0;
                        // SAFETY: no arguments, no memory.
                        unsafe { sched_yield() };
                    }
                    // SAFETY: the lock is held: no other reference to the value exists in
                    // this process (a holder in another process writes its own copy).
                    let out = f(unsafe { &mut *self.value.get() });
                    self.holder.store(0, Release);
                    out
                }
            }

            /// What the threads inside `system` at once share, as in glibc: how many there
            /// are, and the SIGINT and SIGQUIT actions the first of them replaced with
            /// "ignore", which the last puts back.
            static SHELLS: Locked<(u32, SigAction, SigAction)> = Locked::new((0, IGNORE, IGNORE));

            /// The words glibc starts its shell with for `line` (`sh -c --` from 2.38 on).
            fn shell_argv(line: *const c_char) -> [*const c_char; 5] {
                if ends_options() {
                    [c"sh".as_ptr(), c"-c".as_ptr(), c"--".as_ptr(), line, core::ptr::null()]
                } else {
                    [c"sh".as_ptr(), c"-c".as_ptr(), line, core::ptr::null(), core::ptr::null()]
                }
            }

            /// A system call of up to three arguments; returns its result (-errno on failure).
            fn raw3(nr: isize, a: isize, b: isize, c: isize) -> isize {
                let ret: isize;
                // SAFETY: the calls made through this (getpid, pipe2, fcntl, close) write at
                // most the two descriptors pipe2 returns into the live array it is given; the
                // syscall instruction clobbers rcx and r11.
                unsafe {
                    core::arch::asm!(
                        "syscall",
                        inlateout("rax") nr => ret,
                        in("rdi") a,
                        in("rsi") b,
                        in("rdx") c,
                        out("rcx") _,
                        out("r11") _,
                        options(nostack),
                    );
                }
                ret
            }

            /// `wait4(pid, &status, 0, NULL)` by the system call, again after EINTR: unlike
            /// libc's `waitpid` it is no cancellation point, since a cancellation's unwinding
            /// cannot pass this object's frames. Returns `wait4`'s result (or -errno).
            fn wait_for(pid: c_int, status: &mut c_int) -> isize {
                loop {
                    let ret: isize;
                    // SAFETY: wait4 writes the child's status into `status`, which lives for
                    // the call, and reads nothing else; the syscall instruction clobbers rcx
                    // and r11.
                    unsafe {
                        core::arch::asm!(
                            "syscall",
                            inlateout("rax") SYS_WAIT4 => ret,
                            in("rdi") pid as isize,
                            in("rsi") status as *mut c_int,
                            in("rdx") 0isize,
                            in("r10") 0isize,
                            out("rcx") _,
                            out("r11") _,
                            options(nostack),
                        );
                    }
                    if ret != -EINTR {
                        return ret;
                    }
                }
            }

            /// `system`: glibc's starts its shell by an internal `posix_spawn` that no wrapper
            /// sees, so the shell and what it starts ran without corehop. Under `corehop run`
            /// this runs the same steps as glibc's (`sysdeps/posix/system.c`) through this
            /// module's `posix_spawn`: SIGINT and SIGQUIT ignored while any thread is inside,
            /// SIGCHLD blocked, the shell started with the caller's mask and those two signals
            /// at their defaults unless they were ignored, 127 as its exit status if it could
            /// not start, `sh -c --` from glibc 2.38 on. One difference: the wait is no cancellation point (`wait_for`).
            /// Otherwise, and for `system(NULL)`, libc's own.
            ///
            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn system(line: *const c_char) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                static SIGACTION: AtomicUsize = AtomicUsize::new(0);
                type System = unsafe extern "C" fn(*const c_char) -> c_int;
                let hidden = &$hidden;
                match real::<Sigaction>(&SIGACTION, b"sigaction\0") {
                    // SAFETY: the caller's contract.
                    Some(sigaction) if !line.is_null() && hidden.is_hiding() => unsafe { shell(line, sigaction) },
                    // SAFETY: the caller's contract.
                    _ => real::<System>(&REAL, b"system\0").map_or_else(no_such_function, |next| unsafe { next(line) }),
                }
            }

            /// `system(line)` under corehop (see `system`).
            ///
            /// # Safety
            /// `line` is a NUL-terminated string; `sigaction` is libc's.
            unsafe fn shell(line: *const c_char, sigaction: Sigaction) -> c_int {
                // SAFETY (each call of `sigaction`, `sigprocmask` and the `posix_spawnattr`
                // functions below): their arguments are live and of glibc's layout.
                let (intr, quit) = SHELLS.with(|(inside, intr, quit)| {
                    if *inside == 0 {
                        unsafe { sigaction(SIGINT, &IGNORE, intr) };
                        unsafe { sigaction(SIGQUIT, &IGNORE, quit) };
                    }
                    *inside += 1;
                    (*intr, *quit)
                });
                let leave = || {
                    SHELLS.with(|(inside, intr, quit)| {
                        *inside -= 1;
                        if *inside == 0 {
                            unsafe { sigaction(SIGQUIT, quit, core::ptr::null_mut()) };
                            unsafe { sigaction(SIGINT, intr, core::ptr::null_mut()) };
                        }
                    })
                };
                let mut child_only = [0u64; 16];
                child_only[0] = 1 << (SIGCHLD - 1);
                let mut mask: SigSet = [0; 16];
                if unsafe { sigprocmask(SIG_BLOCK, &child_only, &mut mask) } < 0 {
                    leave();
                    return -1;
                }
                let mut reset: SigSet = [0; 16];
                for (signal, was) in [(SIGINT, intr), (SIGQUIT, quit)] {
                    if was.handler != SIG_IGN {
                        reset[0] |= 1 << (signal - 1);
                    }
                }
                let mut attr = SpawnAttr([0; 336]);
                let mut pid: c_int = 0;
                let argv = shell_argv(line);
                let started = unsafe {
                    posix_spawnattr_init(&mut attr);
                    posix_spawnattr_setsigmask(&mut attr, &mask);
                    posix_spawnattr_setsigdefault(&mut attr, &reset);
                    posix_spawnattr_setflags(&mut attr, SPAWN_SETSIGDEF | SPAWN_SETSIGMASK);
                    // SAFETY: the arguments are live; `environ` is the process's environment.
                    let started = posix_spawn(
                        &mut pid,
                        c"/bin/sh".as_ptr(),
                        core::ptr::null(),
                        (&attr as *const SpawnAttr).cast(),
                        argv.as_ptr(),
                        environ,
                    );
                    posix_spawnattr_destroy(&mut attr);
                    started
                };
                let mut status: c_int = -1;
                if started != 0 {
                    // POSIX: as if the shell had exited with 127.
                    status = 127 << 8;
                } else if wait_for(pid, &mut status) != pid as isize {
                    status = -1;
                }
                leave();
                unsafe { sigprocmask(SIG_SETMASK, &mask, core::ptr::null_mut()) };
                status
            }

            /// glibc's `posix_spawn_file_actions_t` (80 bytes on x86-64), filled by libc alone.
            #[repr(C, align(8))]
            struct FileActions([u8; 80]);
            type File = *mut c_void;

            extern "C" {
                fn posix_spawn_file_actions_init(actions: *mut FileActions) -> c_int;
                fn posix_spawn_file_actions_destroy(actions: *mut FileActions) -> c_int;
                fn posix_spawn_file_actions_adddup2(actions: *mut FileActions, fd: c_int, to: c_int) -> c_int;
                fn posix_spawn_file_actions_addclose(actions: *mut FileActions, fd: c_int) -> c_int;
                fn fdopen(fd: c_int, mode: *const c_char) -> File;
            }

            const SYS_CLOSE: isize = 3;
            const SYS_FCNTL: isize = 72;
            const SYS_PIPE2: isize = 293;
            const O_CLOEXEC: isize = 0o2000000;
            const F_DUPFD_CLOEXEC: isize = 1030;
            const F_SETFD: isize = 2;
            const ENOMEM: c_int = 12;
            /// Streams `popen` can keep at once; past them it is libc's own.
            const STREAMS: usize = 64;

            /// The shell of a stream this module's `popen` opened, and the stream's descriptor.
            #[derive(Clone, Copy)]
            struct Shell {
                pid: c_int,
                fd: c_int,
            }

            /// The open streams of `popen`, as glibc's chain of them: a shell started later
            /// closes the others' descriptors, and `pclose` (or `fclose`) waits for the shell.
            struct Streams {
                /// How many streams are open: 0 lets `pclose` and `fclose` skip the lock.
                open: core::sync::atomic::AtomicUsize,
                /// Each entry's `FILE` (0: a free entry). Written with `shells` locked; read
                /// without the lock too, so that closing another file while a stream is open
                /// costs a look at these, not the lock and its `getpid`.
                files: [AtomicUsize; STREAMS],
                shells: Locked<[Shell; STREAMS]>,
            }

            static OPEN_STREAMS: Streams = Streams {
                open: core::sync::atomic::AtomicUsize::new(0),
                files: [const { AtomicUsize::new(0) }; STREAMS],
                shells: Locked::new([Shell { pid: 0, fd: -1 }; STREAMS]),
            };

            impl Streams {
                /// Takes `file` off the list, if this module opened it, with its shell.
                fn take(&self, file: File) -> Option<Shell> {
                    use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
                    if self.open.load(Acquire) == 0 || file.is_null() {
                        return None;
                    }
                    // `popen` listed its stream before it returned it, so a stream of this
                    // module shows here; no other entry can change to this `FILE` meanwhile,
                    // since it stays allocated until this call closes it.
                    let at = self.files.iter().position(|f| f.load(Acquire) == file as usize)?;
                    self.shells.with(|shells| {
                        if self.files[at].load(Relaxed) != file as usize {
                            // Another thread closed it first (a double close).
                            return None;
                        }
                        self.files[at].store(0, Relaxed);
                        self.open.fetch_sub(1, Release);
                        Some(shells[at])
                    })
                }
            }

            fn set_errno(errno: c_int) {
                // SAFETY: the calling thread's errno.
                unsafe { *__errno_location() = errno };
            }

            /// `popen`: glibc's starts its shell by an internal `posix_spawn`, like `system`'s
            /// (see there). Under `corehop run` this takes glibc's steps
            /// (`libio/iopopen.c`) through this module's `posix_spawn`: a close-on-exec pipe,
            /// the child's end moved off the descriptor the shell reads or writes if it is that
            /// one already, then dup'ed onto it, the other streams' descriptors closed in the
            /// child, the parent's end close-on-exec only with `e`, ENOMEM if the shell cannot
            /// start. The stream is a plain `fdopen` one that `pclose` and `fclose` (below)
            /// know by its address. Otherwise (a mode glibc refuses, every stream entry taken)
            /// libc's own.
            ///
            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> File {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                type Popen = unsafe extern "C" fn(*const c_char, *const c_char) -> File;
                let libc = || match real::<Popen>(&REAL, b"popen\0") {
                    // SAFETY: the caller's contract.
                    Some(next) => unsafe { next(command, mode) },
                    None => {
                        no_such_function();
                        core::ptr::null_mut()
                    }
                };
                if command.is_null() || mode.is_null() || !$hidden.is_hiding() {
                    return libc();
                }
                // SAFETY: the caller's contract: a NUL-terminated mode.
                let (mut read, mut write, mut cloexec) = (false, false, false);
                for &c in unsafe { core::ffi::CStr::from_ptr(mode) }.to_bytes() {
                    match c {
                        b'r' => read = true,
                        b'w' => write = true,
                        b'e' => cloexec = true,
                        _ => return libc(),
                    }
                }
                if read == write {
                    return libc();
                }
                OPEN_STREAMS.shells.with(|shells| {
                    let free = OPEN_STREAMS.files.iter().position(|f| f.load(Relaxed) == 0)?;
                    // SAFETY: the caller's contract, and the listed streams' descriptors are open.
                    Some(unsafe { open_stream(command, read, cloexec, shells, free) })
                })
                .unwrap_or_else(libc)
            }

            /// `popen(command, read ? "r" : "w")` into the free entry `free` (see `popen`);
            /// `shells`: the locked list's.
            ///
            /// # Safety
            /// `command` is a NUL-terminated string.
            unsafe fn open_stream(
                command: *const c_char,
                read: bool,
                cloexec: bool,
                shells: &mut [Shell; STREAMS],
                free: usize,
            ) -> File {
                let mut fds: [c_int; 2] = [-1; 2];
                let made = raw3(SYS_PIPE2, fds.as_mut_ptr() as isize, O_CLOEXEC, 0);
                if made < 0 {
                    set_errno(-made as c_int);
                    return core::ptr::null_mut();
                }
                let (parent, mut child, child_fd) = if read { (fds[0], fds[1], 1) } else { (fds[1], fds[0], 0) };
                let close = |fd: c_int| raw3(SYS_CLOSE, fd as isize, 0, 0);
                let fail = |errno: c_int, child: c_int| {
                    close(child);
                    close(parent);
                    set_errno(errno);
                    core::ptr::null_mut()
                };
                if child == child_fd {
                    // The dup2 onto itself would leave it close-on-exec.
                    let moved = raw3(SYS_FCNTL, child as isize, F_DUPFD_CLOEXEC, 0);
                    if moved < 0 {
                        return fail(-moved as c_int, child);
                    }
                    close(child);
                    child = moved as c_int;
                }
                // SAFETY: `parent` is an open descriptor; the mode is NUL-terminated.
                let file = unsafe { fdopen(parent, if read { c"r" } else { c"w" }.as_ptr()) };
                if file.is_null() {
                    return fail(ENOMEM, child);
                }
                let mut actions = FileActions([0; 80]);
                let mut pid: c_int = 0;
                let argv = shell_argv(command);
                // SAFETY: the actions are of glibc's layout and live; the descriptors are open;
                // `environ` is the process's environment.
                let started = unsafe {
                    posix_spawn_file_actions_init(&mut actions);
                    let mut ready = posix_spawn_file_actions_adddup2(&mut actions, child, child_fd) == 0;
                    let listed = shells.iter().zip(&OPEN_STREAMS.files).filter(|(_, f)| f.load(Relaxed) != 0);
                    for (shell, _) in listed.filter(|(s, _)| s.fd != child_fd) {
                        ready &= posix_spawn_file_actions_addclose(&mut actions, shell.fd) == 0;
                    }
                    let started = ready
                        && posix_spawn(
                            &mut pid,
                            c"/bin/sh".as_ptr(),
                            (&actions as *const FileActions).cast(),
                            core::ptr::null(),
                            argv.as_ptr(),
                            environ,
                        ) == 0;
                    posix_spawn_file_actions_destroy(&mut actions);
                    started
                };
                close(child);
                if !started {
                    // SAFETY: `file` is the stream just opened, closed once (with `parent`).
                    unsafe { real_fclose(file) };
                    set_errno(ENOMEM);
                    return core::ptr::null_mut();
                }
                if !cloexec {
                    raw3(SYS_FCNTL, parent as isize, F_SETFD, 0);
                }
                shells[free] = Shell { pid, fd: parent };
                OPEN_STREAMS.files[free].store(file as usize, core::sync::atomic::Ordering::Release);
                OPEN_STREAMS.open.fetch_add(1, core::sync::atomic::Ordering::Release);
                file
            }

            /// libc's `fclose`.
            ///
            /// # Safety
            /// The contract of `fclose`.
            unsafe fn real_fclose(file: File) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                type Fclose = unsafe extern "C" fn(File) -> c_int;
                // SAFETY: the caller's contract.
                real::<Fclose>(&REAL, b"fclose\0").map_or_else(no_such_function, |next| unsafe { next(file) })
            }

            /// Closes a stream of this module's `popen` as glibc closes one of its own: what
            /// is buffered written, the descriptor closed, the shell waited for (again after
            /// EINTR, no cancellation point); its status, or the flush's failure if the shell
            /// exited with 0, or -1 if it cannot be waited for.
            ///
            /// # Safety
            /// `file` and its `shell` were just taken off the list; `file` is open.
            unsafe fn close_stream(file: File, shell: Shell) -> c_int {
                // SAFETY: the contract.
                let closed = unsafe { real_fclose(file) };
                let mut status: c_int = 0;
                let waited = wait_for(shell.pid, &mut status);
                if waited < 0 {
                    set_errno(-waited as c_int);
                    -1
                } else if status != 0 {
                    status
                } else {
                    closed
                }
            }

            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn pclose(file: File) -> c_int {
                static REAL: AtomicUsize = AtomicUsize::new(0);
                type Pclose = unsafe extern "C" fn(File) -> c_int;
                match OPEN_STREAMS.take(file) {
                    // SAFETY: the stream was on the list.
                    Some(shell) => unsafe { close_stream(file, shell) },
                    // SAFETY: the caller's contract.
                    None => real::<Pclose>(&REAL, b"pclose\0").map_or_else(no_such_function, |next| unsafe { next(file) }),
                }
            }

            /// glibc's `fclose` of a `popen` stream waits for its shell too.
            ///
            /// # Safety
            /// The contract of libc's function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn fclose(file: File) -> c_int {
                match OPEN_STREAMS.take(file) {
                    // SAFETY: the stream was on the list.
                    Some(shell) => unsafe { close_stream(file, shell) },
                    // SAFETY: the caller's contract.
                    None => unsafe { real_fclose(file) },
                }
            }

            /// `execl` (`kind` 0), `execlp` (1) or `execle` (2) of the arguments `argv`, laid
            /// out as an array by the naked entry points below (`exec_variadic!`): the program's words up to a
            /// null, then for `execle` the environment.
            ///
            /// # Safety
            /// The contract of the function of that kind; `argv` holds its arguments.
            unsafe extern "C" fn exec_list(path: *const c_char, argv: Argv, kind: c_int) -> c_int {
                // SAFETY: the caller's contract: the words end with a null, and `execle`'s
                // environment follows it.
                unsafe {
                    match kind {
                        0 => execve(path, argv, environ),
                        1 => execvpe(path, argv, environ),
                        _ => {
                            let mut end = 0;
                            while !(*argv.add(end)).is_null() {
                                end += 1;
                            }
                            execve(path, argv, *argv.add(end + 1) as Argv)
                        }
                    }
                }
            }

            $crate::exec_variadic!(execl, 0, exec_list);
            $crate::exec_variadic!(execlp, 1, exec_list);
            $crate::exec_variadic!(execle, 2, exec_list);
        }
    };
}

/// Defines `$name`, an entry point of the variadic `execl` family, as a naked function that
/// hands `$list` (an `unsafe extern "C" fn(path, argv, kind) -> c_int`) the arguments as the
/// array they are, with `$kind`. Why it is sound: a variadic call of pointers passes the first
/// after `path` in rsi, rdx, rcx, r8 and r9 and the rest on the stack above the return
/// address. The entry point takes the return address off, pushes those five registers below
/// the stack's arguments (so all the arguments are one array, at rsp), puts the return address
/// back below them (rsp is then 16-byte aligned for the call), calls `$list` with the array,
/// and on its return takes the five words off and returns with the stack as it came in. The
/// caller's stack above the return address is only read.
#[macro_export]
macro_rules! exec_variadic {
    ($name:ident, $kind:literal, $list:ident) => {
        /// # Safety
        /// The contract of libc's function of this name.
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "pop r11",
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "push r11",
                "lea rsi, [rsp + 8]",
                concat!("mov edx, ", $kind),
                "call {list}",
                "pop r11",
                "add rsp, 40",
                "push r11",
                "ret",
                list = sym $list,
            )
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ffi::{CStr, CString};

    /// An environment array over `entries`, as a process starts with.
    struct Env {
        _strings: Vec<CString>,
        array: Vec<*mut c_char>,
    }

    impl Env {
        fn new(entries: &[Vec<u8>]) -> Env {
            let strings: Vec<CString> = entries.iter().map(|e| CString::new(e.clone()).unwrap()).collect();
            let mut array: Vec<*mut c_char> = strings.iter().map(|s| s.as_ptr() as *mut c_char).collect();
            array.push(core::ptr::null_mut());
            Env { _strings: strings, array }
        }
    }

    fn read(envp: *const *const c_char) -> Vec<Vec<u8>> {
        let mut out = vec![];
        let mut i = 0;
        // SAFETY: a null-terminated array of C strings.
        while let Some(entry) = unsafe { entry_at(envp, i) } {
            out.push(entry.to_vec());
            i += 1;
        }
        out
    }

    fn marker(changed: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
        let mut out = format!("{MARKER}=").into_bytes();
        for (k, (name, before)) in changed.iter().enumerate() {
            marker_item(k == 0, name.as_bytes(), *before, |piece| out.extend_from_slice(piece));
        }
        out
    }

    #[test]
    fn the_loader_asked_to_list_starts_plainly_and_runs_a_program_under_corehop() {
        let describes = |program: &str, args: &[&str]| {
            loader_describes(program.as_bytes(), args.iter().map(|a| a.as_bytes()))
        };
        assert!(describes("/lib64/ld-linux-x86-64.so.2", &["--list", "/bin/true"]));
        assert!(describes("ld.so", &["--library-path", "/x", "--list", "/bin/true"]));
        assert!(describes("/usr/bin/ld.so", &["--inhibit-cache", "--verify", "/bin/true"]));
        assert!(describes("ld.so", &["--list-diagnostics"]));
        // The program's own words are its own; another program's `--list` is its own too.
        assert!(!describes("ld.so", &["/bin/ls", "--list"]));
        assert!(!describes("ld.so", &["--library-path", "--list", "/bin/true"]));
        assert!(!describes("/bin/ls", &["--list"]));
        assert!(!describes("ld.so", &[]));
        let words = [c"ld.so".as_ptr(), c"--list".as_ptr(), c"/bin/true".as_ptr(), core::ptr::null()];
        // SAFETY: NUL-terminated strings and a null-terminated array of them.
        unsafe {
            assert!(start_describes(c"/usr/bin/ld.so".as_ptr(), words.as_ptr()));
            assert!(!start_describes(core::ptr::null(), words.as_ptr()));
            assert!(!start_describes(c"/usr/bin/ld.so".as_ptr(), core::ptr::null()));
            assert!(!start_describes(c"/usr/bin/ld.so".as_ptr(), [core::ptr::null()].as_ptr()));
        }
    }

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    /// Hides in a fresh `Hidden`; what the program then sees.
    fn hide_in_new(entries: &[Vec<u8>]) -> (Box<Hidden>, Vec<Vec<u8>>) {
        let hidden = Box::new(Hidden::new());
        let mut env = Env::new(entries);
        // SAFETY: this thread alone reads the array.
        unsafe { hidden.hide(env.array.as_mut_ptr()) };
        let seen = read(env.array.as_ptr() as *const *const c_char);
        (hidden, seen)
    }

    fn child_of(hidden: &Hidden, entries: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let env = Env::new(entries);
        // SAFETY: a null-terminated array of C strings, unchanged meanwhile.
        unsafe { hidden.for_child(env.array.as_ptr() as *const *const c_char, read) }
    }

    #[test]
    fn the_constructor_looks_for_the_marker_by_its_name() {
        let source = include_str!("hidden_env.rs");
        assert!(source.contains(&format!("c\"{MARKER}\"")));
    }

    #[test]
    fn the_program_sees_what_was_there_before_in_its_places() {
        let (hidden, seen) = hide_in_new(&[
            b("A=1"),
            b("LD_PRELOAD=/lib/user.so:/stub.so"),
            b("COREHOP_POLICY=adaptive"),
            b("B=2"),
            marker(&[
                ("LD_PRELOAD", Some(b"/lib/user.so")),
                ("COREHOP_POLICY", None),
                ("COREHOP_SPIN_NS", None),
            ]),
            b("COREHOP_SPIN_NS=20000"),
            b("C="),
        ]);
        assert_eq!(seen, [b("A=1"), b("LD_PRELOAD=/lib/user.so"), b("B=2"), b("C=")]);
        assert_eq!(hidden.setting(b"LD_PRELOAD"), Some(&b"/lib/user.so:/stub.so"[..]));
        assert_eq!(hidden.setting(b"COREHOP_POLICY"), Some(&b"adaptive"[..]));
        assert_eq!(hidden.setting(b"A"), None);
        let policy = hidden.setting_c(b"COREHOP_POLICY").unwrap();
        // SAFETY: `setting_c` gives a NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(policy) }.to_bytes(), b"adaptive");
    }

    #[test]
    fn entries_without_a_value_are_names_and_stay_as_they_are() {
        // A bare name of corehop's is not its variable: `getenv` would not find it either.
        let (hidden, seen) = hide_in_new(&[
            b("BARE"),
            b("COREHOP_POLICY"),
            b("=odd"),
            b("COREHOP_POLICY=adaptive"),
            marker(&[("COREHOP_POLICY", None)]),
            b("LONG=x=y=z"),
        ]);
        assert_eq!(seen, [b("BARE"), b("COREHOP_POLICY"), b("=odd"), b("LONG=x=y=z")]);
        assert_eq!(hidden.setting(b"COREHOP_POLICY"), Some(&b"adaptive"[..]));
        // A child passed a bare name of corehop's gets it as passed, and corehop's variable.
        let child = child_of(&hidden, &[b("LD_PRELOAD"), b("COREHOP_POLICY"), b("A=1")]);
        assert_eq!(child[..3], [b("LD_PRELOAD"), b("COREHOP_POLICY"), b("A=1")]);
        assert!(child.contains(&b("COREHOP_POLICY=adaptive")));
    }

    #[test]
    fn a_child_gets_corehop_back_and_sees_what_its_parent_passed() {
        let before = [
            b("LD_PRELOAD=/lib/user.so:/stub.so"),
            b("PATH=/bin"),
            b("ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"),
            b("COREHOP_POLICY=adaptive"),
            marker(&[
                ("LD_PRELOAD", Some(b"/lib/user.so")),
                ("ASAN_OPTIONS", Some(b"detect_leaks=0")),
                ("COREHOP_POLICY", Some(b"never")),
                ("COREHOP_STATS_FILE", Some(b"/tmp/x")),
            ]),
        ];
        let (hidden, seen) = hide_in_new(&before);
        assert_eq!(
            seen,
            [
                b("LD_PRELOAD=/lib/user.so"),
                b("PATH=/bin"),
                b("ASAN_OPTIONS=detect_leaks=0"),
                b("COREHOP_POLICY=never"),
                b("COREHOP_STATS_FILE=/tmp/x")
            ]
        );
        // The program passes what it sees, less LD_PRELOAD, plus a variable.
        let passed = [b("PATH=/bin"), b("ASAN_OPTIONS=detect_leaks=0"), b("COREHOP_POLICY=never"), b("X=1")];
        let child = child_of(&hidden, &passed);
        assert_eq!(
            child,
            [
                b("PATH=/bin"),
                b("ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0"),
                b("COREHOP_POLICY=adaptive"),
                b("X=1"),
                b("LD_PRELOAD=/stub.so"),
                marker(&[
                    ("LD_PRELOAD", None),
                    ("ASAN_OPTIONS", Some(b"detect_leaks=0")),
                    ("COREHOP_POLICY", Some(b"never")),
                    ("COREHOP_STATS_FILE", None),
                ]),
            ]
        );
        // And the child, hiding in turn, sees what was passed.
        assert_eq!(hidden_view(&child), passed);
    }

    fn hidden_view(entries: &[Vec<u8>]) -> Vec<Vec<u8>> {
        hide_in_new(entries).1
    }

    #[test]
    fn what_already_holds_corehops_addition_is_passed_as_it_is() {
        let (hidden, _) = hide_in_new(&[
            b("LD_PRELOAD=/stub.so"),
            marker(&[("LD_PRELOAD", None)]),
            b("COREHOP_LIBRARY=/lib.so"),
        ]);
        let child = child_of(&hidden, &[b("LD_PRELOAD=/other.so /stub.so")]);
        assert_eq!(
            child,
            [b("LD_PRELOAD=/other.so /stub.so"), marker(&[("LD_PRELOAD", Some(b"/other.so /stub.so"))])]
        );
        let child = child_of(&hidden, &[b("LD_PRELOAD=")]);
        assert_eq!(child, [b("LD_PRELOAD=/stub.so"), marker(&[("LD_PRELOAD", Some(b""))])]);
    }

    #[test]
    fn an_environment_from_corehop_run_itself_is_passed_as_it_is() {
        let (hidden, _) = hide_in_new(&[b("LD_PRELOAD=/stub.so"), marker(&[("LD_PRELOAD", None)])]);
        let own =
            [b("LD_PRELOAD=/inner.so"), b("COREHOP_POLICY=always"), marker(&[("COREHOP_POLICY", None)])];
        assert_eq!(child_of(&hidden, &own), own);
    }

    #[test]
    fn a_variable_corehop_took_away_comes_back_at_the_end_where_there_is_room() {
        // `corehop run` removed A and B; the array has one slot to spare, the marker's.
        let start = [b("X=1"), marker(&[("A", Some(b"a")), ("B", Some(b"b"))])];
        let (hidden, seen) = hide_in_new(&start);
        assert_eq!(seen, [b("X=1"), b("A=a")]);
        assert_eq!(hidden.setting(b"A"), None);
        // With corehop's own entries gone too, both fit.
        let start = [
            b("X=1"),
            b("LD_PRELOAD=/stub.so"),
            marker(&[("A", Some(b"a")), ("B", Some(b"b")), ("LD_PRELOAD", None)]),
        ];
        assert_eq!(hide_in_new(&start).1, [b("X=1"), b("A=a"), b("B=b")]);
    }

    #[test]
    fn a_child_that_only_lists_its_libraries_gets_no_preload() {
        let (hidden, _) = hide_in_new(&[b("LD_PRELOAD=/stub.so"), marker(&[("LD_PRELOAD", None)])]);
        for trace in ["LD_TRACE_LOADED_OBJECTS=1", "LD_TRACE_LOADED_OBJECTS="] {
            let ldd = [b("PATH=/bin"), b(trace), b("LD_WARN=")];
            assert_eq!(child_of(&hidden, &ldd), ldd);
        }
        let plain = [b("PATH=/bin"), b("LD_TRACE_LOADED_OBJECTSX=1")];
        assert!(child_of(&hidden, &plain).contains(&b("LD_PRELOAD=/stub.so")));
    }

    #[test]
    fn an_environment_naming_a_variable_of_corehops_twice_is_passed_as_it_is() {
        let (hidden, _) = hide_in_new(&[b("LD_PRELOAD=/stub.so"), marker(&[("LD_PRELOAD", None)])]);
        let twice = [b("LD_PRELOAD=/a.so"), b("B=1"), b("LD_PRELOAD=")];
        assert_eq!(child_of(&hidden, &twice), twice);
    }

    #[test]
    fn a_bad_marker_takes_only_itself_away() {
        for bad in [
            "COREHOP_ENV_WAS=LD_PRELOAD=5:ab",
            "COREHOP_ENV_WAS=LD PRELOAD",
            "COREHOP_ENV_WAS=A,",
            "COREHOP_ENV_WAS=A=x:y",
        ] {
            let (hidden, seen) = hide_in_new(&[b("A=1"), b(bad), b("LD_PRELOAD=/stub.so")]);
            assert_eq!(seen, [b("A=1"), b("LD_PRELOAD=/stub.so")], "{bad}");
            assert_eq!(hidden.setting(b"LD_PRELOAD"), None);
            // Nothing hidden: a child gets what it is passed.
            assert_eq!(child_of(&hidden, &[b("B=2")]), [b("B=2")]);
        }
        // No marker: nothing changes.
        let (_, seen) = hide_in_new(&[b("A=1"), b("LD_PRELOAD=/stub.so")]);
        assert_eq!(seen, [b("A=1"), b("LD_PRELOAD=/stub.so")]);
    }

    #[test]
    fn what_does_not_fit_is_passed_as_it_is() {
        let long = vec![b'x'; BYTES];
        let mut entry = b("LD_PRELOAD=");
        entry.extend_from_slice(&long);
        let (hidden, seen) = hide_in_new(&[entry.clone(), marker(&[("LD_PRELOAD", None)])]);
        assert_eq!(seen, [entry]);
        assert_eq!(hidden.setting(b"LD_PRELOAD"), None);
        let (hidden, _) = hide_in_new(&[b("LD_PRELOAD=/stub.so"), marker(&[("LD_PRELOAD", None)])]);
        let many: Vec<Vec<u8>> = (0..CHILD_ENTRIES).map(|i| format!("V{i}=1").into_bytes()).collect();
        assert_eq!(child_of(&hidden, &many), many);
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![Just("LD_PRELOAD".to_string()), Just("COREHOP_POLICY".to_string()), "[A-Z]{1,3}"]
    }

    proptest! {
        /// Whatever a program passes, its child, hiding in turn, sees exactly that.
        #[test]
        fn a_child_sees_what_was_passed(
            before in proptest::collection::vec((name(), proptest::option::of("[ -~]{0,12}")), 0..6),
            passed in proptest::collection::vec((name(), "[ -<>-~]{0,12}"), 0..8),
        ) {
            let mut start = vec![b("LD_PRELOAD=/stub.so"), b("COREHOP_POLICY=adaptive")];
            let mut changed = vec![("LD_PRELOAD", None), ("COREHOP_POLICY", None)];
            let mut names = std::collections::HashSet::from(["LD_PRELOAD".to_string(), "COREHOP_POLICY".to_string()]);
            let extra: Vec<(String, Option<String>)> =
                before.into_iter().filter(|(n, _)| names.insert(n.clone())).collect();
            for (n, v) in &extra {
                start.push(format!("{n}=ours").into_bytes());
                changed.push((n.as_str(), v.as_deref().map(str::as_bytes)));
            }
            start.push(marker(&changed));
            let (hidden, _) = hide_in_new(&start);
            prop_assert!(hidden.setting(b"LD_PRELOAD").is_some());
            let mut seen = std::collections::HashSet::new();
            let passed: Vec<Vec<u8>> = passed
                .into_iter()
                .filter(|(n, _)| seen.insert(n.clone()))
                .map(|(n, v)| format!("{n}={v}").into_bytes())
                .collect();
            let child = child_of(&hidden, &passed);
            prop_assert!(child.iter().any(|e| e.starts_with(b"LD_PRELOAD=") && e.ends_with(b"/stub.so")));
            prop_assert!(child.contains(&b("COREHOP_POLICY=adaptive")));
            prop_assert_eq!(hidden_view(&child), passed);
        }
    }
}
