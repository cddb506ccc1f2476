//! The functions names bind to after the object this file is compiled into, as
//! `dlsym(RTLD_NEXT, name)` finds them, read straight from the objects' GNU hash tables. The
//! preload library's start-up stub (`crates/preload-stub`, which includes this file by path)
//! finds libc's function for each name it exports this way, at the name's first call: one walk
//! over the objects records where their tables are (a [`Scope`]), and each name is then looked
//! up in those tables alone. `dlsym` took the dynamic loader's cold path for each name in each
//! process, and in each child a shell forked, which looked up its own names again: several
//! page faults a process, 7.7 % of a shell loop of short pipelines against 4.5 % with one walk
//! for every name (an empty preloaded library: 3 %; docs/performance.md, "Fiftieth session").
//! Looking every name up in that walk read the tables' lines for all of the stub's names,
//! most of which a process never calls: about 10 µs a process ("Fifty-fourth session").
//!
//! Only what is sure to match `dlsym` is answered; anything else is [`Next::AskTheLoader`]:
//!
//! - The objects are walked with `dl_iterate_phdr`, which holds the lock a `dlopen` or
//!   `dlclose` in another thread takes to change the list (not the one `dlsym` waits for, which
//!   a `dlopen` holds while the library's constructors run), from the caller's object to libc (soname
//!   `libc.so.6`) and no further: every object on the way was loaded at start-up, so it is in
//!   the scope `dlsym` searches (one opened later without `RTLD_GLOBAL` is listed after libc
//!   but is not), and is never unloaded, so its tables stay where the walk found them. A libc
//!   listed before the caller answers nothing.
//! - A definition is used as the loader would: the first object whose table has the name
//!   (an unversioned definition, or its one default version) wins. One that is not a plain
//!   function (an IFUNC, data), or an object with a filter (`DT_FILTER`, `DT_AUXILIARY`) or
//!   without a GNU hash table on the way, is not answered.
//! - Nothing is recorded where the loader's answer changes for the whole process:
//!   `LD_DYNAMIC_WEAK` or `LD_AUDIT` in the environment, or the program's own `DT_AUDIT` or
//!   `DT_DEPAUDIT`.
//!
//! The preload library looks its names up here too when it is preloaded itself, and asks
//! [`defined_anywhere`] whether a sanitizer is in the process: never through `dlsym`, which a
//! library's constructor that waits for a thread making calls would hold up for good.
//!
//! A scope is recorded once and read by every thread: its words are published with a release
//! store of its state, which a loom model below checks. Only `core` (and loom's atomics under
//! `--cfg loom`): the stub is `no_std`. ELF64 only.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicUsize};

#[cfg(not(loom))]
use core::sync::atomic::{AtomicU32, AtomicUsize};

/// The head of `struct dl_phdr_info` (`<link.h>`): what `dl_iterate_phdr` tells of an object.
#[repr(C)]
struct ObjectInfo {
    /// What the object's addresses are offset by.
    addr: usize,
    /// Its path; not read here.
    _name: *const c_char,
    phdr: *const ProgramHeader,
    phnum: u16,
}

/// An `Elf64_Phdr`.
#[repr(C)]
struct ProgramHeader {
    p_type: u32,
    _p_flags: u32,
    _p_offset: u64,
    p_vaddr: u64,
    _p_paddr: u64,
    _p_filesz: u64,
    _p_memsz: u64,
    _p_align: u64,
}

/// An `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_val: u64,
}

/// An `Elf64_Sym`.
#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    _st_other: u8,
    st_shndx: u16,
    st_value: u64,
    _st_size: u64,
}

extern "C" {
    /// The variable `name` of the environment, or null (unset, or a set-user-ID process).
    fn secure_getenv(name: *const c_char) -> *const c_char;
    /// libc's walk over the loaded objects, in the loader's order, under the lock `dlopen`
    /// holds while it lists a new object (not the one it holds while it runs constructors).
    fn dl_iterate_phdr(
        callback: unsafe extern "C" fn(*const ObjectInfo, usize, *mut c_void) -> c_int,
        data: *mut c_void,
    ) -> c_int;
    /// This object's dynamic section (defined by the linker); only its address is taken.
    static _DYNAMIC: Dyn;
}

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_SONAME: i64 = 14;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_DEPAUDIT: i64 = 0x6fff_fefb;
const DT_AUDIT: i64 = 0x6fff_fefc;
const DT_AUXILIARY: i64 = 0x7fff_fffd;
const DT_FILTER: i64 = 0x7fff_ffff;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const SHN_UNDEF: u16 = 0;
const SHN_ABS: u16 = 0xfff1;
const VERSYM_HIDDEN: u16 = 0x8000;
/// Version indices below this are "local" and "global": unversioned definitions.
const FIRST_VERSION: u16 = 2;

/// What an object's dynamic section says, with its addresses relocated.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
struct Tables {
    gnu_hash: usize,
    symtab: usize,
    strtab: usize,
    versym: usize,
    soname: Option<u64>,
    filter: bool,
    audit: bool,
}

impl Tables {
    /// # Safety
    /// `dynamic` is the dynamic section of a loaded object whose addresses are offset by
    /// `base`, or null.
    unsafe fn of(dynamic: *const Dyn, base: usize) -> Tables {
        // The loader rewrites most addresses in a writable dynamic section to run-time ones,
        // and leaves a read-only one as linked: an address below the object's base is an
        // offset from it (objects are mapped far above their own sizes).
        let at = |p: u64| if (p as usize) < base { base.wrapping_add(p as usize) } else { p as usize };
        let mut t = Tables::default();
        let mut entry = dynamic;
        if entry.is_null() {
            return t;
        }
        loop {
            // SAFETY: a dynamic section is an array of entries ended by DT_NULL.
            let Dyn { d_tag, d_val } = unsafe { entry.read() };
            match d_tag {
                DT_NULL => return t,
                DT_GNU_HASH => t.gnu_hash = at(d_val),
                DT_SYMTAB => t.symtab = at(d_val),
                DT_STRTAB => t.strtab = at(d_val),
                DT_VERSYM => t.versym = at(d_val),
                DT_SONAME => t.soname = Some(d_val),
                DT_FILTER | DT_AUXILIARY => t.filter = true,
                DT_AUDIT | DT_DEPAUDIT => t.audit = true,
                _ => {}
            }
            // SAFETY: not past DT_NULL, which ends the array.
            entry = unsafe { entry.add(1) };
        }
    }

    /// Whether the object's soname is `want`.
    ///
    /// # Safety
    /// `self` is a loaded object's, as [`Tables::of`] reads them.
    unsafe fn soname_is(&self, want: &[u8]) -> bool {
        // SAFETY: this function's contract.
        unsafe { self.soname().is_some_and(|name| c_str_is(name, want)) }
    }

    /// Whether the object's soname starts with `prefix`.
    ///
    /// # Safety
    /// As for [`Tables::soname_is`].
    unsafe fn soname_starts(&self, prefix: &[u8]) -> bool {
        // SAFETY: this function's contract.
        unsafe { self.soname().is_some_and(|name| c_str_starts(name, prefix)) }
    }

    /// Where the soname is, if the object has one.
    fn soname(&self) -> Option<*const u8> {
        // DT_SONAME is an offset into the string table, of a NUL-terminated name.
        let offset = self.soname?;
        (self.strtab != 0).then(|| self.strtab.wrapping_add(offset as usize) as *const u8)
    }
}

/// Whether the NUL-terminated string at `s` starts with `prefix` (which holds no NUL).
///
/// # Safety
/// `s` points to a NUL-terminated string.
unsafe fn c_str_starts(s: *const u8, prefix: &[u8]) -> bool {
    for (i, &p) in prefix.iter().enumerate() {
        // SAFETY: bytes up to and including the first NUL are the string's; this one is
        // reached only if none before it was NUL (they equalled `prefix`'s, which are not).
        if unsafe { *s.add(i) } != p {
            return false;
        }
    }
    true
}

/// Whether the NUL-terminated string at `s` is `want` (which holds no NUL).
///
/// # Safety
/// `s` points to a NUL-terminated string.
pub(crate) unsafe fn c_str_is(s: *const u8, want: &[u8]) -> bool {
    // SAFETY: the contract; the byte after a matching prefix is the string's (every byte
    // before it matched one of `want`'s, none of them NUL).
    unsafe { c_str_starts(s, want) && *s.add(want.len()) == 0 }
}

/// The GNU hash of a name (`dl_new_hash`).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(u32::from(c)))
}

/// What one object's table says of a name.
enum Found {
    /// Not defined here: the loader goes on to the next object.
    No,
    /// A plain function, at this address.
    Function(usize),
    /// Defined in a form this module does not answer for.
    Unsure,
}

/// Looks `name` up in one object's GNU hash table as the loader does for `dlsym`.
///
/// # Safety
/// `t` is the tables of a loaded object, with a GNU hash table and a symbol table.
unsafe fn find_in(t: &Tables, base: usize, name: &[u8], hash: u32) -> Found {
    let words = t.gnu_hash as *const u32;
    // SAFETY (this block and the reads below): a GNU hash table is four words (buckets,
    // first hashed symbol, bloom words, bloom shift), the bloom filter (64-bit words), the
    // buckets and the chain, one word per hashed symbol; the chain of a bucket ends at a word
    // with its low bit set. The symbol and version tables hold every symbol the chain names.
    let (nbuckets, symoffset, bloom_size, bloom_shift) =
        unsafe { (words.read(), words.add(1).read(), words.add(2).read(), words.add(3).read()) };
    if nbuckets == 0 || bloom_size == 0 {
        return Found::No;
    }
    let bloom = unsafe { words.add(4) } as *const u64;
    let word = unsafe { bloom.add((hash / 64 % bloom_size) as usize).read_unaligned() };
    let mask = (1u64 << (hash % 64)) | (1u64 << ((hash >> (bloom_shift % 32)) % 64));
    if word & mask != mask {
        return Found::No;
    }
    let buckets = unsafe { bloom.add(bloom_size as usize) } as *const u32;
    let chain = unsafe { buckets.add(nbuckets as usize) };
    let mut index = unsafe { buckets.add((hash % nbuckets) as usize).read() };
    if index < symoffset {
        return Found::No;
    }
    // The loader takes an unversioned definition at once, else the one version not hidden.
    let mut versioned = None;
    let mut versions = 0;
    loop {
        let link = unsafe { chain.add((index - symoffset) as usize).read() };
        if (link | 1) == (hash | 1) {
            let sym = unsafe { &*(t.symtab as *const Sym).add(index as usize) };
            if unsafe { c_str_is((t.strtab + sym.st_name as usize) as *const u8, name) } {
                let version = if t.versym == 0 {
                    0
                } else {
                    unsafe { (t.versym as *const u16).add(index as usize).read() }
                };
                if version & !VERSYM_HIDDEN < FIRST_VERSION {
                    return judge(sym, base);
                }
                if version & VERSYM_HIDDEN == 0 {
                    versions += 1;
                    versioned = Some(sym);
                }
            }
        }
        if link & 1 != 0 {
            break;
        }
        index += 1;
    }
    match (versions, versioned) {
        (1, Some(sym)) => judge(sym, base),
        (0, _) => Found::No,
        // Two versions not hidden: the loader takes neither here and looks further on.
        _ => Found::Unsure,
    }
}

/// A definition the loader would bind: a plain function is answered, anything else is not.
fn judge(sym: &Sym, base: usize) -> Found {
    let (kind, binding) = (sym.st_info & 0xf, sym.st_info >> 4);
    let plain = kind == STT_FUNC
        && (binding == STB_GLOBAL || binding == STB_WEAK)
        && sym.st_shndx != SHN_UNDEF
        && sym.st_shndx != SHN_ABS
        && sym.st_value != 0;
    if plain {
        Found::Function(base.wrapping_add(sym.st_value as usize))
    } else {
        Found::Unsure
    }
}

/// What a scope finds of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// A plain function, at this address.
    Function(usize),
    /// Not answered here: ask `dlsym`.
    AskTheLoader,
}

/// Objects a [`Scope`] holds at most: those after the caller's, up to libc (libc alone, unless
/// other libraries are preloaded after the caller). A name found in none of them is left to
/// the loader, as one found nowhere is.
const SCOPE_OBJECTS: usize = 6;
/// A scope's words per object: its base, then its GNU hash, symbol, string and version tables.
const OBJECT_WORDS: usize = 5;

/// [`Scope::state`]: not recorded, being recorded, recorded.
const EMPTY: u32 = 0;
const RECORDING: u32 = 1;
const READY: u32 = 2;

/// The objects `dlsym(RTLD_NEXT, name)` searches, in its order, with where their tables are:
/// recorded once a process by [`Scope::record`], then read by [`Scope::lookup`] for each name.
/// A forked child shares its parent's objects, and so its scope.
pub struct Scope {
    state: AtomicU32,
    /// Objects recorded, at most [`SCOPE_OBJECTS`].
    count: AtomicUsize,
    words: [AtomicUsize; SCOPE_OBJECTS * OBJECT_WORDS],
}

impl Default for Scope {
    fn default() -> Scope {
        Scope::new()
    }
}

impl Scope {
    /// A scope not recorded yet.
    #[cfg(not(loom))]
    pub const fn new() -> Scope {
        Scope {
            state: AtomicU32::new(EMPTY),
            count: AtomicUsize::new(0),
            words: [const { AtomicUsize::new(0) }; SCOPE_OBJECTS * OBJECT_WORDS],
        }
    }

    /// A scope not recorded yet.
    #[cfg(loom)]
    pub fn new() -> Scope {
        Scope {
            state: AtomicU32::new(EMPTY),
            count: AtomicUsize::new(0),
            words: core::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// Records the objects after the one this file is compiled into, up to libc, in one walk,
    /// unless a thread has begun to (which then records them; meanwhile [`Scope::lookup`]
    /// answers nothing), or the environment changes how the loader binds names for the whole
    /// process (`LD_DYNAMIC_WEAK`, `LD_AUDIT`: then nothing is recorded).
    pub fn record(&self) {
        if !environment_keeps_binding() || !self.begin() {
            return;
        }
        let mut walk = Walk { scope: self, count: 0, past_own: false, first: true };
        // SAFETY: `visit` takes `data` back as the `Walk` it is given here, which outlives the
        // walk; it does not unwind (it cannot panic). Neither variable that changes the
        // loader's answers is set (checked above).
        unsafe { dl_iterate_phdr(visit, (&mut walk as *mut Walk).cast()) };
        self.finish(walk.count);
    }

    /// Claims the recording; false if another thread has.
    fn begin(&self) -> bool {
        self.state.compare_exchange(EMPTY, RECORDING, Relaxed, Relaxed).is_ok()
    }

    /// Notes the `index`th object (the recording thread only, before [`Scope::finish`]).
    fn push(&self, index: usize, base: usize, t: &Tables) {
        // No indexing: a bounds check would link core's panic formatting into the stub.
        if let Some(words) = self.words.chunks_exact(OBJECT_WORDS).nth(index) {
            for (word, value) in words.iter().zip([base, t.gnu_hash, t.symtab, t.strtab, t.versym]) {
                word.store(value, Relaxed);
            }
        }
    }

    /// Publishes the `count` objects pushed.
    fn finish(&self, count: usize) {
        self.count.store(count, Relaxed);
        self.state.store(READY, Release);
    }

    /// The objects recorded, each as its base and tables; `None` while not recorded.
    fn objects(&self) -> Option<impl Iterator<Item = (usize, Tables)> + '_> {
        if self.state.load(Acquire) != READY {
            return None;
        }
        let count = self.count.load(Relaxed).min(SCOPE_OBJECTS);
        Some(self.words.chunks_exact(OBJECT_WORDS).take(count).map(|words| {
            let mut values = words.iter().map(|word| word.load(Relaxed));
            let mut next = || values.next().unwrap_or(0);
            let base = next();
            (
                base,
                Tables {
                    gnu_hash: next(),
                    symtab: next(),
                    strtab: next(),
                    versym: next(),
                    ..Tables::default()
                },
            )
        }))
    }

    /// The function `name` (a trailing NUL is not part of it) binds to in the first recorded
    /// object that defines it, if the definition is a plain function; else
    /// [`Next::AskTheLoader`]. `None` while the scope is not recorded.
    ///
    /// # Safety
    /// The scope was recorded by [`Scope::record`] in this process or in the one it was forked
    /// from.
    pub unsafe fn lookup(&self, name: &[u8]) -> Option<Next> {
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        let hash = gnu_hash(name);
        for (base, t) in self.objects()? {
            // SAFETY: a loaded object's tables, as `visit` checked them, and it stays loaded
            // (this function's contract: it was loaded at start-up).
            match unsafe { find_in(&t, base, name, hash) } {
                Found::Function(address) => return Some(Next::Function(address)),
                Found::Unsure => return Some(Next::AskTheLoader),
                Found::No => {}
            }
        }
        Some(Next::AskTheLoader)
    }
}

/// Whether the environment leaves the loader binding names as the tables say: not with
/// `LD_DYNAMIC_WEAK` (weak definitions) or `LD_AUDIT` (audit modules) set.
fn environment_keeps_binding() -> bool {
    // SAFETY: the names are NUL-terminated; secure_getenv returns null or a string of the
    // environment, which is not read.
    let set = |name: &core::ffi::CStr| !unsafe { secure_getenv(name.as_ptr()) }.is_null();
    !set(c"LD_DYNAMIC_WEAK") && !set(c"LD_AUDIT")
}

/// The start-up functions of the sanitizers' runtimes that check system calls in the calling
/// thread (their interceptors check a call's buffers, or note the order of calls on a
/// descriptor): a process that has one keeps every call with its caller, and `corehop run`
/// lets AddressSanitizer's runtime come after the preloaded library (`ASAN_OPTIONS`). Their
/// interceptors of `pthread_create` keep a registry of threads whose lock they may hold when
/// they make a call: the start-up stub starts no thread of its own where one is loaded.
pub const SANITIZER_INITS: [&core::ffi::CStr; 4] =
    [c"__asan_init", c"__hwasan_init", c"__msan_init", c"__tsan_init"];

/// Whether a sanitizer's runtime ([`SANITIZER_INITS`]) is in the process, by
/// [`defined_anywhere`]; `None` if that cannot say.
pub fn sanitizer_loaded() -> Option<bool> {
    defined_anywhere(&SANITIZER_INITS.map(core::ffi::CStr::to_bytes))
}

/// Whether a loaded object defines one of `names` (a trailing NUL is not part of a name), in
/// any form, as `dlsym(RTLD_DEFAULT, name)` would find it in a program that loaded nothing
/// with `dlopen`. Read from the objects' tables: `dlsym` waits for the loader's lock, which a
/// thread running a library's constructor holds, maybe while it waits for the caller. `None`
/// if an object has no GNU hash table: only `dlsym` can say then.
pub fn defined_anywhere(names: &[&[u8]]) -> Option<bool> {
    let mut search = Search { names, found: false, unsure: false };
    // SAFETY: `visit_searching` takes `data` back as the `Search` it is given here, which
    // outlives the walk; it does not unwind (it cannot panic).
    unsafe { dl_iterate_phdr(visit_searching, (&mut search as *mut Search).cast()) };
    if search.found {
        Some(true)
    } else {
        (!search.unsure).then_some(false)
    }
}

/// A [`defined_anywhere`] under way.
struct Search<'a> {
    names: &'a [&'a [u8]],
    found: bool,
    /// Whether an object could not be searched.
    unsure: bool,
}

/// [`defined_anywhere`]'s step over one object: 0 goes on to the next one, 1 ends the walk.
///
/// # Safety
/// As for [`visit`], with `data` a `Search`.
unsafe extern "C" fn visit_searching(info: *const ObjectInfo, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: this function's contract, as in `visit`.
    let (search, info) = unsafe { (&mut *data.cast::<Search>(), &*info) };
    // SAFETY: as in `visit`.
    let t = unsafe { Tables::of(dynamic_section(info), info.addr) };
    if t.gnu_hash == 0 || t.symtab == 0 || t.strtab == 0 {
        // The vDSO has a GNU hash table; an object without one is searched by `dlsym` alone.
        search.unsure = true;
        return 0;
    }
    for name in search.names {
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        // SAFETY: a loaded object's tables, with a GNU hash table and a symbol table.
        if !matches!(unsafe { find_in(&t, info.addr, name, gnu_hash(name)) }, Found::No) {
            search.found = true;
            return 1;
        }
    }
    0
}

/// A recording under way: what [`visit`] keeps between objects.
struct Walk<'a> {
    scope: &'a Scope,
    count: usize,
    /// Whether the walk has passed the object this file is compiled into.
    past_own: bool,
    /// Whether the next object is the first, the program.
    first: bool,
}

/// [`Scope::record`]'s step over one object: 0 goes on to the next one, 1 ends the walk.
///
/// # Safety
/// `data` is a `Walk` no one else borrows, and `info` the loader's description of a loaded
/// object, as `dl_iterate_phdr` passes them.
unsafe extern "C" fn visit(info: *const ObjectInfo, _size: usize, data: *mut c_void) -> c_int {
    const GO_ON: c_int = 0;
    const STOP: c_int = 1;
    // SAFETY: this function's contract (`data` is `record`'s `Walk`); `info` is valid for this
    // call, and its first four fields are the ones every glibc has filled in since
    // `dl_iterate_phdr` was added.
    let (walk, info) = unsafe { (&mut *data.cast::<Walk>(), &*info) };
    // SAFETY: the loader's program headers of a loaded object, `phnum` of them.
    let dynamic = unsafe { dynamic_section(info) };
    // SAFETY: the object is loaded, and stays so while the walk holds the loader's lock.
    let t = unsafe { Tables::of(dynamic, info.addr) };
    let first = core::mem::replace(&mut walk.first, false);
    // SAFETY: as above.
    let is_libc = unsafe { t.soname_is(b"libc.so.6") };
    if !walk.past_own {
        walk.past_own = dynamic == core::ptr::addr_of!(_DYNAMIC);
        return if (first && t.audit) || is_libc { STOP } else { GO_ON };
    }
    // SAFETY: as above.
    if unsafe { t.soname_starts(b"linux-") } {
        // The kernel's vDSO: listed, but not in the scope `dlsym` searches.
        return GO_ON;
    }
    if t.filter || t.gnu_hash == 0 || t.symtab == 0 || t.strtab == 0 || walk.count == SCOPE_OBJECTS {
        return STOP;
    }
    walk.scope.push(walk.count, info.addr, &t);
    walk.count += 1;
    if is_libc {
        STOP
    } else {
        GO_ON
    }
}

/// The run-time address of an object's dynamic section (null if it has none).
///
/// # Safety
/// `info` is `dl_iterate_phdr`'s, of an object that is loaded.
unsafe fn dynamic_section(info: &ObjectInfo) -> *const Dyn {
    for i in 0..usize::from(info.phnum) {
        // SAFETY: `phdr` holds `phnum` headers (the caller's contract).
        let header = unsafe { &*info.phdr.add(i) };
        if header.p_type == PT_DYNAMIC {
            return info.addr.wrapping_add(header.p_vaddr as usize) as *const Dyn;
        }
    }
    core::ptr::null()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// `dlsym(RTLD_DEFAULT, name)`: the global scope from the program on.
    fn loader(name: &str) -> usize {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) as usize }
    }

    /// A scope recorded now.
    fn recorded() -> Scope {
        assert!(std::env::var_os("LD_DYNAMIC_WEAK").is_none() && std::env::var_os("LD_AUDIT").is_none());
        let scope = Scope::new();
        // The test program is the object this file is compiled into, listed first.
        scope.record();
        scope
    }

    /// What a scope recorded now answers for one name.
    fn next_function(name: &str) -> Next {
        let scope = recorded();
        // SAFETY: recorded in this process.
        unsafe { scope.lookup(name.as_bytes()) }.expect("a recorded scope answers")
    }

    /// The names of every kind the stub routes: plain wrappers, weak ones, versioned ones.
    const NAMES: [&str; 29] = [
        "read",
        "write",
        "pread64",
        "readv",
        "open",
        "open64",
        "openat",
        "__open_2",
        "stat",
        "lstat",
        "fstat",
        "fstat64",
        "fstatat",
        "fstatat64",
        "statx",
        "fsync",
        "sendfile",
        "sendfile64",
        "poll",
        "close",
        "dup2",
        "dup3",
        "vfork",
        "clone",
        "_Fork",
        "syscall",
        "prctl",
        "unshare",
        "setns",
    ];

    #[test]
    fn the_stub_s_names_bind_to_what_the_loader_finds() {
        for name in NAMES {
            match next_function(name) {
                Next::Function(address) => assert_eq!(address, loader(name), "{name}"),
                other => panic!("{name}: {other:?}, the loader finds {:#x}", loader(name)),
            }
        }
    }

    #[test]
    fn the_kernel_s_vdso_is_not_searched() {
        // The vDSO defines clock_gettime too, and is listed right after the program; `dlsym`
        // finds libc's.
        assert_eq!(next_function("clock_gettime"), Next::Function(loader("clock_gettime")));
    }

    #[test]
    fn one_scope_answers_every_name_as_the_loader_and_a_second_records_nothing() {
        let scope = recorded();
        for name in NAMES {
            // SAFETY: recorded in this process.
            let found = unsafe { scope.lookup(name.as_bytes()) };
            assert_eq!(found, Some(Next::Function(loader(name))), "{name}");
            // A trailing NUL is not part of the name.
            let with_nul = format!("{name}\0");
            // SAFETY: as above.
            assert_eq!(unsafe { scope.lookup(with_nul.as_bytes()) }, found, "{name}");
        }
        // The test program's libraries up to libc (libgcc_s before it, say).
        let objects: Vec<_> = scope.objects().expect("recorded").collect();
        assert!((1..=SCOPE_OBJECTS).contains(&objects.len()), "{objects:?}");
        // Recording again is a no-op: the first recording stands.
        scope.record();
        assert_eq!(scope.objects().expect("recorded").collect::<Vec<_>>(), objects);
    }

    #[test]
    fn a_scope_not_recorded_answers_nothing() {
        let scope = Scope::new();
        // SAFETY: nothing is read from a scope not recorded.
        assert_eq!(unsafe { scope.lookup(b"read") }, None);
        assert!(scope.begin(), "the first claim wins");
        assert!(!scope.begin(), "a second finds it claimed");
        // SAFETY: as above: being recorded is not recorded.
        assert_eq!(unsafe { scope.lookup(b"read") }, None);
    }

    #[test]
    fn what_it_cannot_answer_for_is_left_to_the_loader() {
        // IFUNCs (their variants are picked at load) and a name nobody defines.
        for name in ["memcpy", "strlen", "corehop_no_such_function"] {
            assert_eq!(next_function(name), Next::AskTheLoader, "{name}");
        }
    }

    #[test]
    fn a_name_is_defined_anywhere_where_the_loader_finds_it() {
        for name in ["read", "dl_iterate_phdr", "memcpy", "corehop_no_such_function", "__asan_init"] {
            let found = defined_anywhere(&[name.as_bytes()]).expect("every object here has a GNU hash table");
            assert_eq!(found, loader(name) != 0, "{name}");
        }
        assert_eq!(defined_anywhere(&[b"corehop_no_such_function\0", b"fstat\0"]), Some(true));
        assert_eq!(defined_anywhere(&[]), Some(false));
    }

    #[test]
    fn the_gnu_hash_is_the_loader_s() {
        // Values from the GNU hash's definition (dl_new_hash).
        assert_eq!(gnu_hash(b""), 5381);
        assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
        assert_eq!(gnu_hash(b"exit"), 0x7c96_7e3f);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A thread recording a scope and one looking a name up: the reader sees no object, or
    /// every word the recorder wrote.
    #[test]
    fn loom_a_scope_is_read_whole_or_not_at_all() {
        loom::model(|| {
            let scope = Arc::new(Scope::new());
            let tables = |i: usize| Tables {
                gnu_hash: 10 * i + 1,
                symtab: 10 * i + 2,
                strtab: 10 * i + 3,
                versym: 10 * i + 4,
                ..Tables::default()
            };
            let recorder = {
                let scope = Arc::clone(&scope);
                loom::thread::spawn(move || {
                    assert!(scope.begin());
                    for i in 0..2 {
                        scope.push(i, 1000 * (i + 1), &tables(i));
                    }
                    scope.finish(2);
                })
            };
            if let Some(objects) = scope.objects() {
                let objects: Vec<_> = objects.collect();
                assert_eq!(objects, vec![(1000, tables(0)), (2000, tables(1))]);
            }
            recorder.join().unwrap();
            assert_eq!(scope.objects().map(Iterator::count), Some(2));
        });
    }
}
