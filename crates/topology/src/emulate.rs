//! Emulation overrides: "cpu 1 runs at a quarter of its speed".
//!
//! The override is part of the machine description; the runtime realises it by duty cycling
//! and the simulator by a slower clock, so both read it from [`Cpu::emulated_speed`].

use crate::{excerpt, Cpu, CpuId, Machine, TopologyError, VALUE_CHARS};

impl Machine {
    /// Applies overrides written as `"1=0.25,3=0.5"`: comma-separated `cpu=fraction` pairs,
    /// where `cpu` is a dense id or an inclusive range of them (`"2-3=0.5"`) and `fraction`
    /// is in (0, 1]. Nothing changes unless every pair is valid.
    ///
    /// # Examples
    /// ```
    /// use corehop_topology::{presets, CpuId};
    /// let mut machine = presets::by_name("switch-cc").unwrap();
    /// machine.apply_emulation("1=0.25").unwrap();
    /// assert_eq!(machine.cpu(CpuId(1)).unwrap().effective_speed(), 0.25);
    /// assert!(machine.apply_emulation("7=0.5").is_err());
    /// ```
    pub fn apply_emulation(&mut self, overrides: &str) -> Result<(), TopologyError> {
        let parsed = parse_emulation(overrides, self.cpus.len())?;
        for (cpu, fraction) in parsed {
            self.cpus[cpu.0].emulated_speed = Some(fraction);
        }
        Ok(())
    }

    /// Removes every emulation override.
    pub fn clear_emulation(&mut self) {
        self.cpus.iter_mut().for_each(|cpu: &mut Cpu| cpu.emulated_speed = None);
    }
}

/// Parses `"1=0.25,2-3=0.5"` for a machine with `cpus` CPUs into (cpu, fraction) pairs.
pub fn parse_emulation(input: &str, cpus: usize) -> Result<Vec<(CpuId, f64)>, TopologyError> {
    let bad = |reason: String| TopologyError::Emulation { input: input.to_string(), reason };
    let mut pairs = Vec::new();
    if input.trim().is_empty() {
        return Err(bad("no overrides given".into()));
    }
    for part in input.split(',') {
        let (target, fraction) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("{:?} has no `=`", excerpt(part.trim(), VALUE_CHARS))))?;
        let number = |text: &str| {
            text.trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("{:?} is not a CPU number", excerpt(text.trim(), VALUE_CHARS))))
        };
        let (first, last) = match target.split_once('-') {
            Some((first, last)) => (number(first)?, number(last)?),
            None => (number(target)?, number(target)?),
        };
        if first > last {
            return Err(bad(format!("range {} runs backwards", target.trim())));
        }
        let text = excerpt(fraction.trim(), VALUE_CHARS);
        let fraction: f64 = fraction.trim().parse().map_err(|_| bad(format!("{text:?} is not a number")))?;
        if !(fraction > 0.0 && fraction <= 1.0) {
            // As typed: `1e300` written out in full is 301 digits.
            return Err(bad(format!("speed {text} is outside (0, 1]")));
        }
        for cpu in first..=last {
            if cpu >= cpus {
                return Err(TopologyError::UnknownCpu { cpu, cpus });
            }
            pairs.push((CpuId(cpu), fraction));
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CoreGroup, MachineBuilder};

    fn four() -> Machine {
        MachineBuilder::new("four").group(CoreGroup::new(4)).build().unwrap()
    }

    #[test]
    fn overrides_set_effective_speed() {
        let mut machine = four();
        machine.apply_emulation("1=0.25, 2-3=0.5").unwrap();
        let speeds: Vec<f64> = machine.cpus().iter().map(Cpu::effective_speed).collect();
        assert_eq!(speeds, vec![1.0, 0.25, 0.5, 0.5]);
        machine.clear_emulation();
        assert!(machine.cpus().iter().all(|c| c.emulated_speed.is_none()));
    }

    #[test]
    fn bad_overrides_change_nothing_and_say_why() {
        for (input, needle) in [
            ("4=0.5", "cpu4 does not exist"),
            ("1=0", "outside (0, 1]"),
            ("1=1.5", "outside (0, 1]"),
            ("1=1e300", "speed 1e300 is outside"),
            ("1=fast", "not a number"),
            ("1", "no `=`"),
            ("x=0.5", "not a CPU number"),
            ("3-1=0.5", "backwards"),
            ("", "no overrides"),
            ("0=0.5,9=0.5", "cpu9 does not exist"),
        ] {
            let mut machine = four();
            let message = machine.apply_emulation(input).unwrap_err().to_string();
            assert!(message.contains(needle), "{input:?}: {message}");
            assert_eq!(machine, four(), "{input:?} changed the machine");
        }
    }
}
