//! The program's environment: corehop's own, in its order, with what `corehop run` changes
//! put in place.
//!
//! `Command` keeps the variables it is asked to change in a sorted map and, once one is
//! changed, hands the child the whole environment in key order. So `corehop run -- env` (which
//! sets only `_`, as a shell does) listed the variables in another order than plain `env`. Here
//! a variable set keeps its place, a new one follows the others and a removed one is left out,
//! and the program is started with that list: by `execvpe` from a hook that runs where
//! `Command` would exec, for a program that replaces corehop (`corehop run` without a summary
//! to collect), and by `posix_spawnp` (`crate::spawn`) for one that corehop waits for (a hook
//! makes a spawning `Command` fork instead, 0.6 to 1 ms more a spawn here).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Changes to corehop's environment for the program it starts.
#[derive(Debug, Default)]
pub struct Environment {
    changes: Vec<(OsString, Option<OsString>)>,
}

impl Environment {
    /// Gives `key` the value `value`.
    pub fn set(&mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> &mut Self {
        self.change(key.into(), Some(value.into()))
    }

    /// Leaves `key` out.
    pub fn remove(&mut self, key: impl Into<OsString>) -> &mut Self {
        self.change(key.into(), None)
    }

    /// Empties `key` if it is set here (so that it keeps its place, and the preload code can
    /// show the program its value: see [`Environment::hide_from_program`]), else leaves it
    /// out. For a variable whose empty value means none.
    pub fn clear(&mut self, key: &str) -> &mut Self {
        match std::env::var_os(key) {
            Some(_) => self.set(key, ""),
            None => self.remove(key),
        }
    }

    fn change(&mut self, key: OsString, value: Option<OsString>) -> &mut Self {
        match self.changes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.changes.push((key, value)),
        }
        self
    }

    /// Has the preload code take the changes of `names` back out of the program's sight and
    /// show it what each held here before (`corehop_sys::hidden_env`): sets the marker that
    /// says which changed and what they held. Call it after the changes.
    pub fn hide_from_program(&mut self, names: &[&str]) -> &mut Self {
        self.hide_from_program_in(names, |name| std::env::var_os(name))
    }

    fn hide_from_program_in(&mut self, names: &[&str], here: impl Fn(&str) -> Option<OsString>) -> &mut Self {
        use corehop_sys::hidden_env::{marker_item, MARKER};
        let mut marker = Vec::new();
        for name in names {
            let Some((_, value)) = self.changes.iter().find(|(k, _)| k == name) else { continue };
            let before = here(name);
            if *value == before {
                continue;
            }
            marker_item(
                marker.is_empty(),
                name.as_bytes(),
                before.as_deref().map(OsStr::as_bytes),
                |piece| marker.extend_from_slice(piece),
            );
        }
        if marker.is_empty() {
            self.remove(MARKER)
        } else {
            self.set(MARKER, <OsString as std::os::unix::ffi::OsStringExt>::from_vec(marker))
        }
    }

    /// `current` with the changes: a variable set keeps its place, one that was not there
    /// follows in the order set, one removed is left out.
    fn applied(&self, current: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
        let change = |key: &OsString| self.changes.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        let mut out: Vec<(OsString, OsString)> = Vec::new();
        for (key, value) in current {
            match change(&key) {
                None => out.push((key, value)),
                Some(Some(new)) => out.push((key, new.clone())),
                Some(None) => {}
            }
        }
        for (key, value) in &self.changes {
            if let (Some(value), false) = (value, out.iter().any(|(k, _)| k == key)) {
                out.push((key.clone(), value.clone()));
            }
        }
        out
    }

    /// Makes `command` start `argv` (its first word found in `PATH` as `execvp` finds it) with
    /// corehop's environment changed. Call it after every other `pre_exec` hook: the program
    /// starts from this one. With nothing to change, `command` is left as it is.
    pub fn start_with(&self, command: &mut Command, argv: &[&OsStr]) {
        if self.changes.is_empty() {
            return;
        }
        let args: Option<Vec<CString>> = argv.iter().map(|a| CString::new(a.as_bytes()).ok()).collect();
        match (args, self.entries()) {
            (Some(args), Some(envp)) if !args.is_empty() => {
                let start = exec::Start::new(args, envp);
                // SAFETY: `Start::exec` makes one async-signal-safe call with memory built
                // here, before the fork (its argument in `exec`).
                unsafe { command.pre_exec(move || Err(start.exec())) };
            }
            // A word with a NUL in it (no program can be given one): `Command`'s way, whose
            // spawn reports it.
            _ => self.set_on(command),
        }
    }

    /// Gives `command` the changes `Command`'s way (in key order): for a program no list of
    /// ours can carry.
    fn set_on(&self, command: &mut Command) {
        for (key, value) in &self.changes {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
    }

    /// The program's environment as `NAME=VALUE` strings in corehop's order with the changes
    /// made; `None` with nothing to change (the program gets corehop's own, as it is). Names
    /// and values come from corehop's environment and command line, which hold no NUL byte.
    pub fn entries(&self) -> Option<Vec<CString>> {
        if self.changes.is_empty() {
            return None;
        }
        let entries = self.applied(std::env::vars_os());
        Some(
            entries
                .iter()
                .filter_map(|(k, v)| CString::new([k.as_bytes(), b"=", v.as_bytes()].concat()).ok())
                .collect(),
        )
    }
}

/// The one `unsafe` piece: the exec, with pointer arrays made before the fork.
mod exec {
    use std::ffi::{c_char, CString};

    /// A program's words and environment, and the null-terminated pointer arrays `execvpe`
    /// takes, pointing into them.
    pub struct Start {
        _args: Vec<CString>,
        _envp: Vec<CString>,
        argv: Vec<*const c_char>,
        envv: Vec<*const c_char>,
    }

    // SAFETY: the pointers point into the `CString`s the value owns, whose heap buffers never
    // move or change while it lives; nothing writes through them. `Command` wants its hook
    // `Send + Sync`; the hook only reads.
    unsafe impl Send for Start {}
    unsafe impl Sync for Start {}

    impl Start {
        /// `args` must not be empty.
        pub fn new(args: Vec<CString>, envp: Vec<CString>) -> Start {
            let array = crate::spawn::null_terminated;
            Start { argv: array(&args), envv: array(&envp), _args: args, _envp: envp }
        }

        /// Becomes the program; returns only why it could not.
        pub fn exec(&self) -> std::io::Error {
            // SAFETY: both arrays end in a null pointer and point at NUL-terminated strings
            // owned by `self`; `argv[0]` exists (`new`'s contract). `execvpe` neither
            // allocates nor takes a lock on its way to `execve` (glibc searches `PATH` in a
            // buffer on the stack, as `execvp`, which `Command` itself calls after the fork),
            // so it may run between fork and exec.
            unsafe { libc::execvpe(self.argv[0], self.argv.as_ptr(), self.envv.as_ptr()) };
            std::io::Error::last_os_error()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect()
    }

    #[test]
    fn changes_keep_the_order_of_the_environment() {
        let mut env = Environment::default();
        env.set("M", "new").set("NEW2", "b").set("NEW1", "a").remove("A").set("NEW2", "c");
        let out = env.applied(vars(&[("Z", "1"), ("A", "2"), ("M", "3"), ("B", "4")]));
        assert_eq!(out, vars(&[("Z", "1"), ("M", "new"), ("B", "4"), ("NEW2", "c"), ("NEW1", "a")]));
    }

    #[test]
    fn the_marker_names_what_changed_and_what_it_held() {
        let mut env = Environment::default();
        env.set("LD_PRELOAD", "/a.so:/stub.so")
            .set("COREHOP_POLICY", "adaptive")
            .set("SAME", "1")
            .remove("GONE");
        env.hide_from_program(&["LD_PRELOAD", "COREHOP_POLICY", "SAME", "GONE", "UNCHANGED"]);
        let here = |name: &str| match name {
            "LD_PRELOAD" => Some(OsString::from("/a.so")),
            "SAME" => Some(OsString::from("1")),
            "GONE" => Some(OsString::from("x,y")),
            _ => None,
        };
        env.hide_from_program_in(&["LD_PRELOAD", "COREHOP_POLICY", "SAME", "GONE", "UNCHANGED"], here);
        let out = env.applied(vars(&[("GONE", "x,y")]));
        assert_eq!(out.last().unwrap().0, corehop_sys::hidden_env::MARKER);
        assert_eq!(out.last().unwrap().1, "LD_PRELOAD=5:/a.so,COREHOP_POLICY,GONE=3:x,y");
        // Nothing changed: no marker.
        let mut env = Environment::default();
        env.set("SAME", "1").hide_from_program_in(&["SAME"], here);
        assert_eq!(env.applied(vec![]), vars(&[("SAME", "1")]));
    }

    #[test]
    fn removing_what_is_not_there_changes_nothing() {
        let mut env = Environment::default();
        env.remove("GONE");
        assert_eq!(env.applied(vars(&[("Z", "1"), ("A", "2")])), vars(&[("Z", "1"), ("A", "2")]));
    }
}
