//! CPU lists in the kernel's format (`0-3,6`) and cache sizes in sysfs format (`32K`).

use crate::{excerpt, TopologyError, VALUE_CHARS};

/// Parses a CPU list as sysfs writes it (`cpu/online`, `shared_cpu_list`, `cpuset.cpus`):
/// comma-separated numbers and inclusive ranges, e.g. `"0-3,6"`. Returns the numbers sorted
/// without duplicates. An empty or blank string is the empty set (sysfs writes that, e.g. for
/// `cpu/offline`). CPU numbers past [`crate::MAX_CPUS`] are an error, not an allocation.
///
/// # Examples
/// ```
/// use corehop_topology::parse_cpu_list;
/// assert_eq!(parse_cpu_list("0-3,6\n").unwrap(), vec![0, 1, 2, 3, 6]);
/// assert!(parse_cpu_list("3-1").is_err());
/// ```
pub fn parse_cpu_list(input: &str) -> Result<Vec<usize>, TopologyError> {
    let bad = |reason: String| TopologyError::CpuList { input: input.to_string(), reason };
    let trimmed = input.trim();
    let mut cpus = Vec::new();
    if trimmed.is_empty() {
        return Ok(cpus);
    }
    for part in trimmed.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("empty element between commas".into()));
        }
        let number = |text: &str| {
            let cpu = text
                .trim()
                .parse::<u128>()
                .map_err(|_| bad(format!("{:?} is not a CPU number", excerpt(text, VALUE_CHARS))))?;
            if cpu >= crate::MAX_CPUS as u128 {
                return Err(TopologyError::TooManyCpus {
                    what: format!("CPU number in {:?}", excerpt(input, VALUE_CHARS)),
                    value: cpu,
                });
            }
            Ok(cpu as usize)
        };
        match part.split_once('-') {
            None => cpus.push(number(part)?),
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return Err(bad(format!("range {part} runs backwards")));
                }
                cpus.extend(first..=last);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Writes CPU numbers in the kernel's compact list format, e.g. `[0, 1, 2, 3, 6]` → `"0-3,6"`.
/// The input need not be sorted; duplicates are dropped.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        let end = sorted[i];
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    parts.join(",")
}

/// Parses a size in bytes: a plain number or a number with a binary unit `K`, `M` or `G`
/// (optionally followed by `B` or `iB`), as sysfs writes cache sizes (`"32K"`). A unit may
/// follow a decimal fraction (`"1.5M"`), rounded down to whole bytes.
pub fn parse_size(input: &str) -> Result<u64, TopologyError> {
    let bad = || TopologyError::Size { input: input.to_string() };
    let text = input.trim();
    let number_end = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // Nine fraction digits keep the arithmetic below in u128 range.
    if whole.is_empty() || fraction.len() > 9 || fraction.contains('.') {
        return Err(bad());
    }
    let value: u64 = whole.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(bad()),
    };
    let part = match fraction {
        "" => 0,
        digits => {
            let numerator: u128 = digits.parse().map_err(|_| bad())?;
            ((numerator << shift) / 10u128.pow(digits.len() as u32)) as u64
        }
    };
    value
        .checked_mul(1 << shift)
        .and_then(|bytes| bytes.checked_add(part))
        .filter(|&bytes| bytes > 0)
        .ok_or_else(bad)
}

/// Writes a size with the largest binary unit that divides it exactly: `3670016` → `"3584K"`.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpu_numbers_past_the_limit_are_refused_before_allocating() {
        for list in ["0-18446744073709551615", "8192", "0-1000000000", "99999999999999999999999999"] {
            let err = parse_cpu_list(list).unwrap_err();
            assert!(matches!(err, TopologyError::TooManyCpus { .. }), "{list}: {err}");
        }
        assert_eq!(parse_cpu_list("8191").unwrap(), vec![8191]);
    }

    #[test]
    fn parses_kernel_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-1,4-5,7").unwrap(), vec![0, 1, 4, 5, 7]);
        assert_eq!(parse_cpu_list(" 2,0-1 \n").unwrap(), vec![0, 1, 2]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpu_list("1,1,0-1").unwrap(), vec![0, 1]);
    }

    #[test]
    fn rejects_malformed_lists_naming_the_problem() {
        for (input, needle) in [
            ("3-1", "backwards"),
            ("a", "not a CPU number"),
            ("1-", "not a CPU number"),
            ("1,,2", "empty element"),
            ("1,", "empty element"),
            ("-1", "not a CPU number"),
            ("0-3:2", "not a CPU number"),
        ] {
            let message = parse_cpu_list(input).unwrap_err().to_string();
            assert!(message.contains(needle), "{input:?}: {message}");
            assert!(message.contains(input), "{input:?}: {message}");
        }
    }

    #[test]
    fn formats_compactly() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(format_cpu_list(&[5, 3, 4, 3]), "3-5");
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(format_cpu_list(&[1, 3]), "1,3");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32K").unwrap(), 32 * 1024);
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KB\n").unwrap(), 64 * 1024);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("0.5K").unwrap(), 512);
        assert_eq!(parse_size("1.3").unwrap(), 1, "rounded down to whole bytes");
        for bad in ["", "K", "12Q", "0", "-1K", "99999999999999G", ".5M", "1.2.3M", "0.0001", "1.0000000001K"]
        {
            assert!(matches!(parse_size(bad), Err(TopologyError::Size { .. })), "{bad:?}");
        }
        assert_eq!(format_size(3584 * 1024), "3584K");
        assert_eq!(format_size(2 << 20), "2M");
        assert_eq!(format_size(1000), "1000");
    }

    proptest! {
        #[test]
        fn list_round_trips(cpus in proptest::collection::btree_set(0usize..300, 0..40)) {
            let cpus: Vec<usize> = cpus.into_iter().collect();
            prop_assert_eq!(parse_cpu_list(&format_cpu_list(&cpus)).unwrap(), cpus);
        }

        #[test]
        fn size_round_trips(bytes in 1u64..(1 << 40)) {
            prop_assert_eq!(parse_size(&format_size(bytes)).unwrap(), bytes);
        }
    }
}
