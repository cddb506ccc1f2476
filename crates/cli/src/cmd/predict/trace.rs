//! System-call traces as [`TraceCall`] values: `strace -f -T -tt` output, or a simple CSV.
//!
//! strace records a call site only with `-k` (a stack trace after each call): the call site is
//! then the first frame outside the object that made the system call (libc), as the preload
//! library's is the return address into the program. Without `-k`, for calls that name a path
//! (open, stat, …) the path stands in for it: the paper's AState hashes argument registers,
//! and different paths are different pointers. Byte-moving calls are keyed by descriptor and
//! byte count instead. strace's other decorations are read past: `-tt`/`-ttt`/`-r` times,
//! `-i` instruction pointers, `-n` system-call numbers, `-y`/`-yy` descriptor names.
//!
//! A CSV trace's header names its columns, in any order and with any others beside them
//! (ignored); without a header the columns are `call,fd,size,site,run_ns`. Fields may be quoted
//! as spreadsheets and pandas write them, and a byte-order mark before the first line is read past.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use corehop_policy::offload::{CallDesc, CallKind};
use corehop_topology::{excerpt, VALUE_CHARS};

/// One completed call from a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceCall {
    pub call: CallDesc,
    pub run_ns: u64,
    /// Which process of the trace made it, numbered from 0 in order of appearance (0 where the
    /// trace does not say): each process under the library predicts by its own runs.
    pub process: u32,
}

/// Which syntax a trace file is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Decide from the first data line: `call,…` is CSV, anything with `name(` is strace.
    Auto,
    /// `strace -f -T -tt` (pid prefix and timestamps optional, `-T` durations required).
    Strace,
    /// `call,fd,size,site,run_ns` per line, or the columns a header line names (`call` and
    /// `run_ns` required; `fd`, `size`, `site` default to -1, 0, 0); `#` comments are allowed,
    /// fields may be quoted.
    Csv,
}

/// A parsed trace: the calls and the lines that carried no completed call.
#[derive(Debug)]
pub struct Trace {
    pub format: Format,
    pub calls: Vec<TraceCall>,
    /// Signals, exits, calls that never returned (`= ?`), unfinished calls at the end.
    pub skipped: usize,
}

/// A line the parser could not read, with where it was.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {reason}")]
pub struct ParseError {
    pub file: String,
    pub line: usize,
    pub reason: String,
}

pub fn parse(path: &Path, text: &str, format: Format) -> Result<Trace, ParseError> {
    let file = path.display().to_string();
    // Spreadsheets save UTF-8 CSV with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let format = match format {
        Format::Auto => detect(text),
        other => other,
    };
    let mut parser = Parser {
        file,
        columns: Columns::POSITIONAL,
        data_seen: false,
        frames: None,
        pending: HashMap::new(),
        processes: HashMap::new(),
        process: 0,
        process_count: 0,
        calls: vec![],
        skipped: 0,
    };
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let result = match format {
            Format::Csv => parser.csv_line(line),
            _ => parser.strace_line(line),
        };
        result.map_err(|reason| ParseError { file: parser.file.clone(), line: line_no, reason })?;
    }
    let skipped = parser.skipped + parser.pending.len();
    Ok(Trace { format, calls: parser.calls, skipped })
}

fn detect(text: &str) -> Format {
    let first = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or("");
    let fields = csv_fields(first);
    let names_call = fields.iter().any(|field| field == "call");
    if names_call || (!first.contains('(') && fields.len() == 5) {
        Format::Csv
    } else {
        Format::Strace
    }
}

/// Where each field of a CSV line is (column indices).
#[derive(Clone, Copy, Debug)]
struct Columns {
    call: usize,
    fd: Option<usize>,
    size: Option<usize>,
    site: Option<usize>,
    run_ns: usize,
    /// Fields a line has.
    width: usize,
    /// Whether a header named them.
    named: bool,
}

impl Columns {
    const POSITIONAL: Columns =
        Columns { call: 0, fd: Some(1), size: Some(2), site: Some(3), run_ns: 4, width: 5, named: false };

    /// The columns a header line names, or why it cannot be a trace's header.
    fn from_header(fields: &[&str]) -> Result<Columns, String> {
        let find = |name: &str| fields.iter().position(|f| f.eq_ignore_ascii_case(name));
        let (Some(call), Some(run_ns)) = (find("call"), find("run_ns")) else {
            return Err(format!(
                "the header names no `call` and `run_ns` columns (it has {} fields; a trace has \
                 call,fd,size,site,run_ns)",
                fields.len()
            ));
        };
        Ok(Columns {
            call,
            fd: find("fd"),
            size: find("size"),
            site: find("site"),
            run_ns,
            width: fields.len(),
            named: true,
        })
    }
}

/// What the frames of a `strace -k` stack trace have said so far about the call before them.
struct Frames {
    /// The call's index in [`Parser::calls`].
    call: usize,
    /// The object of the innermost frame (the one that made the system call).
    inner: Option<String>,
}

struct Parser {
    file: String,
    /// Where a CSV line's fields are (from its header, if any).
    columns: Columns,
    /// Whether a CSV data line came (a header after it is a mistake).
    data_seen: bool,
    /// The stack trace being read (`strace -k`), if the line before was a completed call or
    /// one of its frames, until the call site is found.
    frames: Option<Frames>,
    /// pid → the text of an `<unfinished ...>` call so far.
    pending: HashMap<String, String>,
    /// pid (a thread's: strace names threads by their own ids) → its process's number.
    processes: HashMap<String, u32>,
    /// The process of the calls being read, and how many processes there are so far.
    process: u32,
    process_count: u32,
    calls: Vec<TraceCall>,
    skipped: usize,
}

/// `text` quoted for an error message, at most [`VALUE_CHARS`] characters of it: a trace line
/// can be megabytes long (a binary file given as a trace).
fn quote(text: &str) -> String {
    format!("{:?}", excerpt(text, VALUE_CHARS))
}

impl Parser {
    /// The number of the process `pid` belongs to (a new one for a pid not seen yet).
    fn process_of(&mut self, pid: &str) -> u32 {
        if let Some(&process) = self.processes.get(pid) {
            return process;
        }
        let process = self.process_count;
        self.process_count += 1;
        self.processes.insert(pid.to_string(), process);
        process
    }

    fn csv_line(&mut self, line: &str) -> Result<(), String> {
        let line = line.trim();
        if let Some(pid) = crate::cmd::run::trace_pid(line) {
            self.process = self.process_of(pid);
            return Ok(());
        }
        if line.is_empty() || line.starts_with('#') {
            return Ok(());
        }
        let fields = csv_fields(line);
        let fields: Vec<&str> = fields.iter().map(AsRef::as_ref).collect();
        if fields.iter().any(|f| f.eq_ignore_ascii_case("call")) {
            if self.data_seen {
                return Err("a header line after data lines".into());
            }
            self.columns = Columns::from_header(&fields)?;
            return Ok(());
        }
        self.data_seen = true;
        let columns = self.columns;
        if fields.len() != columns.width {
            let which = if columns.named { "as the header names" } else { "call,fd,size,site,run_ns" };
            return Err(format!("expected {} fields {which}, found {}", columns.width, fields.len()));
        }
        let call = fields[columns.call];
        if call.is_empty() {
            return Err("empty call name".into());
        }
        let number = |at: Option<usize>, what: &str| match at {
            None => Ok(0),
            Some(i) => fields[i].parse::<u64>().map_err(|e| match e.kind() {
                std::num::IntErrorKind::PosOverflow => {
                    format!("{what} {} is past the largest ({})", quote(fields[i]), u64::MAX)
                }
                _ => format!("{what} {} is not a whole number", quote(fields[i])),
            }),
        };
        let fd: i32 = match columns.fd {
            None => -1,
            Some(i) => fields[i].parse().map_err(|e: std::num::ParseIntError| match e.kind() {
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                    format!("fd {} is outside {}..={}", quote(fields[i]), i32::MIN, i32::MAX)
                }
                _ => format!("fd {} is not an integer", quote(fields[i])),
            })?,
        };
        let desc = CallDesc::new(
            CallKind::from_name(call),
            fd,
            number(columns.size, "size")?,
            number(columns.site, "site")?,
        );
        let run_ns = number(Some(columns.run_ns), "run_ns")?;
        self.calls.push(TraceCall { call: desc, run_ns, process: self.process });
        Ok(())
    }

    fn strace_line(&mut self, line: &str) -> Result<(), String> {
        let mut rest = line.trim();
        if rest.is_empty() {
            return Ok(());
        }
        if let Some(frame) = rest.strip_prefix('>') {
            self.frame(frame.trim());
            return Ok(());
        }
        self.frames = None;
        // "[pid  123] " (terminal output) or "123 " (-o with -f).
        let mut pid = String::new();
        if let Some(after) = rest.strip_prefix("[pid") {
            let end = after.find(']').ok_or("unclosed [pid …]")?;
            pid = after[..end].trim().to_string();
            rest = after[end + 1..].trim_start();
        } else if let Some((head, tail)) = rest.split_once(' ') {
            if !head.is_empty() && head.bytes().all(|b| b.is_ascii_digit()) {
                pid = head.to_string();
                rest = tail.trim_start();
            }
        }
        // "12:34:56.789012 " (-tt) or "1700000000.123456 " (-ttt).
        if let Some((head, tail)) = rest.split_once(' ') {
            if head.bytes().next().is_some_and(|b| b.is_ascii_digit())
                && head.bytes().all(|b| b.is_ascii_digit() || b == b':' || b == b'.')
            {
                rest = tail.trim_start();
            }
        }
        // "[00007f…] " (-i: the instruction pointer, "[????…]" where there is none) and
        // "[  0] " (-n: the call's number).
        while let Some(after) = rest.strip_prefix('[') {
            let Some((inside, tail)) = after.split_once(']') else { break };
            if !inside.trim().bytes().all(|b| b.is_ascii_hexdigit() || b == b'?') {
                break;
            }
            rest = tail.trim_start();
        }
        self.process = if pid.is_empty() { 0 } else { self.process_of(&pid) };
        if rest.starts_with("---") || rest.starts_with("+++") || rest.starts_with("strace:") {
            self.skipped += 1;
            return Ok(());
        }
        if let Some(resumed) = rest.strip_prefix("<... ") {
            let (name, tail) = resumed.split_once(" resumed>").ok_or("a '<... ' line without 'resumed>'")?;
            let Some(start) = self.pending.remove(&pid) else {
                // Its start was cut off (a trimmed trace): nothing to pair it with.
                self.skipped += 1;
                return Ok(());
            };
            if !start.starts_with(name.trim()) {
                return Err(format!(
                    "pid {pid:?} resumed {} but its unfinished call was {}",
                    quote(name),
                    quote(&start)
                ));
            }
            return self.complete(&format!("{start}{tail}"));
        }
        if let Some(start) = rest.strip_suffix("<unfinished ...>") {
            self.pending.insert(pid, start.to_string());
            return Ok(());
        }
        self.complete(rest)
    }

    /// `name(args) = ret <secs>`.
    fn complete(&mut self, text: &str) -> Result<(), String> {
        let open = text.find('(').ok_or_else(|| format!("not a system call: {}", quote(text)))?;
        let name = &text[..open];
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("not a system call name: {}", quote(name)));
        }
        let text = text.trim_end();
        if text.ends_with("= ?") {
            self.skipped += 1; // exit, execve in a dying thread: never returned
            return Ok(());
        }
        let Some(dur_start) = text.rfind('<').filter(|_| text.ends_with('>')) else {
            return Err(format!(
                "{}: no <duration> at the end (record with strace -T)",
                excerpt(name, VALUE_CHARS)
            ));
        };
        let run_ns = seconds_to_ns(&text[dur_start + 1..text.len() - 1]).ok_or_else(|| {
            format!("{}: bad duration {}", excerpt(name, VALUE_CHARS), quote(&text[dur_start..]))
        })?;
        let close = args_end(&text[..dur_start])
            .ok_or_else(|| format!("{}: no ') = result'", excerpt(name, VALUE_CHARS)))?;
        let args = split_args(&text[open + 1..close]);
        if name.starts_with("clone") && args.iter().any(|a| a.contains("CLONE_THREAD")) {
            // A new thread: its calls are its process's.
            let result = text[close + 1..dur_start].trim_start().trim_start_matches('=').trim();
            if let Some(tid) =
                result.split_whitespace().next().filter(|t| t.bytes().all(|b| b.is_ascii_digit()))
            {
                self.processes.insert(tid.to_string(), self.process);
            }
        }
        let kind = CallKind::from_name(name);
        // "3" or, with -y, "3</etc/passwd>".
        let fd = args.first().and_then(|a| a.split('<').next()?.parse::<i32>().ok()).unwrap_or(-1);
        let size = match kind {
            CallKind::Read
            | CallKind::Write
            | CallKind::Pread
            | CallKind::Pwrite
            | CallKind::Sendto
            | CallKind::Recvfrom => args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0),
            CallKind::Sendfile => args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0),
            CallKind::Readv | CallKind::Writev => args.get(1).map_or(0, |iov| iov_total(iov)),
            _ => 0,
        };
        let site = if kind.moves_bytes() {
            0
        } else {
            args.iter().take(2).find(|a| a.starts_with('"')).map_or(0, |path| fnv64(path))
        };
        self.frames = Some(Frames { call: self.calls.len(), inner: None });
        self.calls.push(TraceCall {
            call: CallDesc::new(kind, fd, size, site),
            run_ns,
            process: self.process,
        });
        Ok(())
    }

    /// One frame of a `strace -k` stack trace, innermost first: `object(symbol+off) [0xaddr]`.
    /// The first frame outside the innermost frame's object is the call site.
    fn frame(&mut self, frame: &str) {
        let Some(frames) = self.frames.as_mut() else { return };
        let object = frame.split(['(', ' ', '[']).next().unwrap_or("");
        match &frames.inner {
            None => frames.inner = Some(object.to_string()),
            Some(inner) if inner != object => {
                self.calls[frames.call].call.site = fnv64(frame);
                self.frames = None;
            }
            Some(_) => {}
        }
    }
}

/// The fields of a CSV line, trimmed, each unquoted if it was quoted (RFC 4180: `"a,b"` is one
/// field, `""` inside quotes is a quote). A line without quotes is only split.
fn csv_fields(line: &str) -> Vec<Cow<'_, str>> {
    if !line.contains('"') {
        return line.split(',').map(|field| Cow::Borrowed(field.trim())).collect();
    }
    let mut fields = vec![];
    let mut chars = line.chars().peekable();
    loop {
        let mut field = String::new();
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') | None => break,
                    Some(c) => field.push(c),
                }
            }
        }
        // Unquoted, the field; quoted, anything between the closing quote and the comma.
        while let Some(c) = chars.next_if(|c| *c != ',') {
            field.push(c);
        }
        fields.push(Cow::Owned(field.trim().to_string()));
        if chars.next().is_none() {
            return fields;
        }
    }
}

/// Where the argument list ends in `name(args)   = result`: the last " =" preceded by ')'
/// (strace pads with spaces; results may contain '=' themselves).
fn args_end(text: &str) -> Option<usize> {
    text.rmatch_indices(" =")
        .map(|(i, _)| text[..i].trim_end())
        .find(|head| head.ends_with(')'))
        .map(|head| head.len() - 1)
}

/// "0.000123" → 123 000 ns, without going through floating point.
fn seconds_to_ns(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let frac: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().ok()? };
    whole.checked_mul(1_000_000_000)?.checked_add(frac)
}

/// Top-level comma-separated arguments, respecting quotes, brackets and braces, and the name
/// `-y` prints after a descriptor (`3</a, b>`, `5<TCP:[1.2.3.4:5->6.7.8.9:10]>`).
fn split_args(text: &str) -> Vec<String> {
    let mut args = vec![];
    let mut current = String::new();
    let (mut depth, mut quoted, mut escaped) = (0i32, false, false);
    // Brackets open inside a descriptor's name, while in one.
    let mut named: Option<i32> = None;
    for c in text.chars() {
        if let Some(open) = named.as_mut() {
            current.push(c);
            match c {
                '(' | '[' | '{' => *open += 1,
                ')' | ']' | '}' => *open -= 1,
                '>' if *open <= 0 => named = None,
                _ => {}
            }
            continue;
        }
        if c == '<' && !current.trim().is_empty() && current.trim().bytes().all(|b| b.is_ascii_digit()) {
            current.push(c);
            named = Some(0);
            continue;
        }
        if quoted {
            current.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                args.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_string());
    }
    args
}

/// Sum of `iov_len=N` in a printed iovec array.
fn iov_total(iov: &str) -> u64 {
    iov.split("iov_len=")
        .skip(1)
        .filter_map(|part| part.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
        .sum()
}

fn fnv64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strace(text: &str) -> Trace {
        parse(Path::new("t.strace"), text, Format::Auto).unwrap()
    }

    #[test]
    fn reads_plain_and_resumed_lines() {
        let t = strace(
            "100 00:00:01.000001 read(3, \"ab, c)\"..., 4096) = 4096 <0.000012>\n\
             100 00:00:01.000002 write(4, \"x\"..., 10240 <unfinished ...>\n\
             101 00:00:01.000003 openat(AT_FDCWD, \"/etc/x\", O_RDONLY) = -1 ENOENT (No such file or directory) <0.000007>\n\
             100 00:00:01.000004 <... write resumed>) = 10240 <0.013747>\n\
             100 00:00:01.000005 writev(1, [{iov_base=\"a\", iov_len=5}, {iov_base=\"b\", iov_len=7}], 2) = 12 <0.000002>\n\
             101 00:00:01.000006 --- SIGCHLD {si_signo=SIGCHLD} ---\n\
             101 00:00:01.000007 exit_group(0)     = ?\n",
        );
        let got: Vec<(CallKind, i32, u64, u64)> =
            t.calls.iter().map(|c| (c.call.kind, c.call.fd, c.call.size, c.run_ns)).collect();
        assert_eq!(
            got,
            vec![
                (CallKind::Read, 3, 4096, 12_000),
                (CallKind::Openat, -1, 0, 7_000),
                (CallKind::Write, 4, 10240, 13_747_000),
                (CallKind::Writev, 1, 12, 2_000),
            ]
        );
        assert_eq!(t.skipped, 2);
        assert_ne!(t.calls[1].call.site, 0, "the path stands in for the call site");
    }

    #[test]
    fn reads_csv_as_spreadsheets_and_pandas_write_it() {
        // A byte-order mark, CRLF line ends, quoted fields (one with a comma and a quote in it).
        let text = "\u{feff}\"run_ns\",\"call\",\"note\"\r\n\"1500\",\"read\",\"a, \"\"b\"\"\"\r\n 900 , write ,\r\n";
        let t = parse(Path::new("t.csv"), text, Format::Auto).unwrap();
        assert_eq!(t.format, Format::Csv);
        let got: Vec<(CallKind, u64)> = t.calls.iter().map(|c| (c.call.kind, c.run_ns)).collect();
        assert_eq!(got, [(CallKind::Read, 1500), (CallKind::Write, 900)]);
        assert_eq!(csv_fields(r#"a,"b,""c""",,d"#), ["a", "b,\"c\"", "", "d"]);
        assert_eq!(csv_fields(""), [""]);
    }

    #[test]
    fn calls_belong_to_the_process_that_made_them() {
        let csv = parse(
            Path::new("t.csv"),
            "call,fd,size,site,run_ns\n# pid 7\nread,3,1,1,10\n# pid 9\nread,3,1,1,10\n\
             # pid 9: 4 more calls not recorded (buffer full)\nread,3,1,1,10\n# pid 7\nread,3,1,1,10\n",
            Format::Auto,
        )
        .unwrap();
        assert_eq!(csv.calls.iter().map(|c| c.process).collect::<Vec<_>>(), [0, 1, 1, 0]);
        // strace -f: a thread (clone with CLONE_THREAD) is its process's; a forked child is not.
        let t = strace(
            "100 read(3, \"\", 1) = 0 <0.000001>\n\
             100 clone(child_stack=0x7f, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|CLONE_SYSVSEM) = 101 <0.000020>\n\
             101 read(3, \"\", 1) = 0 <0.000001>\n\
             100 clone3({flags=CLONE_VM|CLONE_VFORK, exit_signal=SIGCHLD, stack=0x7f, stack_size=0x9000}, 88 <unfinished ...>\n\
             100 <... clone3 resumed>) = 102 <0.000030>\n\
             102 read(3, \"\", 1) = 0 <0.000001>\n",
        );
        assert_eq!(t.calls.iter().map(|c| c.process).collect::<Vec<_>>(), [0, 0, 0, 0, 1]);
    }

    #[test]
    fn reads_csv_with_header_and_comments() {
        let t = parse(
            Path::new("t.csv"),
            "call,fd,size,site,run_ns\n# c\nread,3,4096,7,1500\nfsync,3,0,9,80000\n",
            Format::Auto,
        )
        .unwrap();
        assert_eq!(t.format, Format::Csv);
        assert_eq!(
            t.calls[1],
            TraceCall { call: CallDesc::new(CallKind::Fsync, 3, 0, 9), run_ns: 80_000, process: 0 }
        );
    }

    #[test]
    fn reads_past_what_stracers_other_options_add() {
        // -i (instruction pointers), -n (call numbers), -y (descriptor names), -tt.
        let t = strace(
            "7 00:00:01.000001 [00007f680b555ad7] [  0] read(3</etc/passwd>, \"r\", 4096) = 1 <0.000012>\n\
             7 00:00:01.000002 [00007f680b555ad8] [ 44] sendto(5<TCP:[1.2.3.4:5->6.7.8.9:10]>, \"x\", 9, 0, NULL, 0) = 9 <0.000003>\n\
             7 00:00:01.000003 [????????????????] +++ exited with 0 +++\n",
        );
        let got: Vec<(CallKind, i32, u64)> =
            t.calls.iter().map(|c| (c.call.kind, c.call.fd, c.call.size)).collect();
        assert_eq!(got, vec![(CallKind::Read, 3, 4096), (CallKind::Sendto, 5, 9)]);
        assert_eq!(t.skipped, 1);
        let named = strace("write(4</tmp/a, b>, \"x\", 7) = 7 <0.000003>\n");
        assert_eq!((named.calls[0].call.fd, named.calls[0].call.size), (4, 7), "a comma in the name");
    }

    #[test]
    fn a_stack_trace_gives_the_call_site_outside_the_c_library() {
        // strace -f -k: frames follow the completed line, innermost first.
        let t = strace(
            "9 read(3, \"a\", 10) = 1 <0.000002>\n\
             \x20> /lib/libc.so.6(__read+0x12) [0x10012]\n\
             \x20> /lib/libc.so.6(_IO_file_underflow+0x40) [0x8040]\n\
             \x20> /usr/bin/prog() [0x1234]\n\
             \x20> /usr/bin/prog() [0x5678]\n\
             9 read(3, \"a\", 10) = 1 <0.000002>\n\
             \x20> /lib/libc.so.6(__read+0x12) [0x10012]\n\
             \x20> /usr/bin/prog() [0x2222]\n\
             9 read(3, \"a\", 10 <unfinished ...>\n\
             10 exit_group(0) = ?\n\
             9 <... read resumed>) = 1 <0.000002>\n\
             \x20> /lib/libc.so.6(__read+0x12) [0x10012]\n\
             \x20> /usr/bin/prog() [0x1234]\n\
             9 openat(AT_FDCWD, \"/x\", O_RDONLY) = 4 <0.000002>\n\
             9 openat(AT_FDCWD, \"/x\", O_RDONLY) = 4 <0.000002>\n\
             \x20> /lib/libc.so.6(open64+0x4) [0x4004]\n\
             \x20> /usr/bin/prog() [0x1234]\n",
        );
        let sites: Vec<u64> = t.calls.iter().map(|c| c.call.site).collect();
        assert_eq!(sites.len(), 5);
        assert_eq!(sites[0], sites[2], "the same caller, the same site");
        assert_ne!(sites[0], sites[1], "another caller, another site");
        assert_ne!(sites[0], 0);
        assert_eq!(sites[3], fnv64("\"/x\""), "no stack trace: the path stands in");
        assert_eq!(sites[4], sites[0], "a stack trace: the caller, not the path");
    }

    #[test]
    fn a_csv_header_names_the_columns_in_any_order() {
        let t = parse(
            Path::new("t.csv"),
            "ts,run_ns,call,size,fd\n1,1500,read,4096,3\n2,80000,fsync,0,3\n",
            Format::Auto,
        )
        .unwrap();
        assert_eq!(t.format, Format::Csv);
        assert_eq!(
            t.calls[0],
            TraceCall { call: CallDesc::new(CallKind::Read, 3, 4096, 0), run_ns: 1500, process: 0 }
        );
        let err = |text: &str| parse(Path::new("t.csv"), text, Format::Csv).unwrap_err().to_string();
        assert!(err("call,fd,size\nread,3,1\n").contains("t.csv:1: the header names no `call` and `run_ns`"));
        assert_eq!(
            err("call,run_ns,fd\nread,5\n"),
            "t.csv:2: expected 3 fields as the header names, found 2"
        );
        assert_eq!(
            err("read,3,1,0,9\ncall,fd,size,site,run_ns\n"),
            "t.csv:2: a header line after data lines"
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        let err =
            parse(Path::new("bad.csv"), "call,fd,size,site,run_ns\nread,3,x,0,1\n", Format::Csv).unwrap_err();
        assert_eq!(err.to_string(), "bad.csv:2: size \"x\" is not a whole number");
        let err = parse(Path::new("big.csv"), "read,3,1,0,18446744073709551616\n", Format::Csv).unwrap_err();
        assert_eq!(
            err.to_string(),
            "big.csv:1: run_ns \"18446744073709551616\" is past the largest (18446744073709551615)"
        );
        let err = parse(Path::new("fd.csv"), "read,2147483648,1,0,5\n", Format::Csv).unwrap_err();
        assert_eq!(err.to_string(), "fd.csv:1: fd \"2147483648\" is outside -2147483648..=2147483647");
        let err = parse(Path::new("t.strace"), "read(3, \"\", 10) = 0\n", Format::Strace).unwrap_err();
        assert!(err.to_string().starts_with("t.strace:1: read: no <duration>"), "{err}");
        let err = parse(Path::new("t.strace"), "hello world\n", Format::Strace).unwrap_err();
        assert!(err.to_string().contains("t.strace:1: not a system call"), "{err}");
    }

    #[test]
    fn errors_quote_a_long_line_only_in_part() {
        let line = "é".repeat(1 << 20);
        let err = parse(Path::new("t.strace"), &line, Format::Strace).unwrap_err().to_string();
        assert!(err.starts_with("t.strace:1: not a system call: \""), "{err}");
        assert!(err.contains(&format!("…({} bytes)…", line.len() - "é".len() * VALUE_CHARS)), "{err}");
        assert!(err.chars().count() < 250, "{} characters of message", err.chars().count());
        let name = "x".repeat(1 << 20);
        let err = parse(Path::new("t.strace"), &format!("{name}(3) = 0"), Format::Strace).unwrap_err();
        assert!(err.to_string().len() < 250, "{} bytes of message", err.to_string().len());
        let err = parse(Path::new("t.csv"), &format!("read,3,{name},0,1"), Format::Csv).unwrap_err();
        assert!(err.to_string().len() < 250, "{} bytes of message", err.to_string().len());
    }

    #[test]
    fn durations_parse_exactly() {
        assert_eq!(seconds_to_ns("0.000012"), Some(12_000));
        assert_eq!(seconds_to_ns("1.5"), Some(1_500_000_000));
        assert_eq!(seconds_to_ns("2"), Some(2_000_000_000));
        assert_eq!(seconds_to_ns("0.1234567891"), None);
        assert_eq!(seconds_to_ns("x.1"), None);
    }
}
