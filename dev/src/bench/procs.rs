//! What the kernel says about processes and the machine (`/proc`): resident memory, CPU time, the local
//! stack's server processes, and the machine a run happened on.

use std::{fs, path::Path};

use serde::Serialize;

/// One look at a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// Resident set size now, kB.
    pub rss_kb: u64,
    /// Peak resident set size so far (`VmHWM`), kB.
    pub hwm_kb: u64,
    /// User + system CPU time of all its threads, clock ticks.
    pub cpu_ticks: u64,
}

/// Samples process `pid`; `None` when it is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |field: &str| {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    Some(ProcSample {
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
        cpu_ticks: cpu_ticks(pid)?,
    })
}

/// User + system time of a process (all threads), clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is index 0, so utime (14) and stime (15) are 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 on Linux when that cannot be run).
pub fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Busy and total CPU time of the whole machine (all cores, `/proc/stat`), clock ticks.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The local stack's server processes a run uses, found by name and port; other servers on the machine
/// (other people's test stacks) and PostgreSQL backends of other databases count as "other".
#[derive(Clone, Debug, Default)]
pub struct Servers {
    pub nats: Vec<u32>,
    /// The postmaster, its background processes and the backends connected to the run's database.
    pub postgres: Vec<u32>,
    /// SecantusDB, the Python MongoDB-wire server.
    pub mongo: Vec<u32>,
}

impl Servers {
    /// The NATS server listening on `nats_port`, the SecantusDB on `mongo_port`, and PostgreSQL as
    /// used by database `pg_database`.
    pub fn find(nats_port: u16, mongo_port: u16, pg_database: &str) -> Self {
        let mut s = Self::default();
        let Ok(dir) = fs::read_dir("/proc") else {
            return s;
        };
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            let comm = comm.trim();
            let on_port = |cmd: &str, port: u16| {
                let words: Vec<&str> = cmd.split_whitespace().collect();
                words
                    .windows(2)
                    .any(|w| matches!(w[0], "-p" | "--port") && w[1] == port.to_string())
            };
            if comm == "nats-server" {
                if on_port(&cmdline(&entry.path()), nats_port) {
                    s.nats.push(pid);
                }
            } else if comm == "postgres" {
                let cmd = cmdline(&entry.path());
                // A backend's title names its database and client; background processes name neither.
                let backend = cmd.contains('(') || cmd.contains("[local]");
                if !backend || cmd.contains(pg_database) {
                    s.postgres.push(pid);
                }
            } else if comm.starts_with("python") {
                let cmd = cmdline(&entry.path());
                if cmd.contains("secantus") && on_port(&cmd, mongo_port) {
                    s.mongo.push(pid);
                }
            }
        }
        s
    }

    /// CPU ticks of each group: nats, postgres, mongo.
    pub fn ticks(&self) -> [u64; 3] {
        let sum = |pids: &[u32]| pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
        [sum(&self.nats), sum(&self.postgres), sum(&self.mongo)]
    }
}

fn cmdline(proc_dir: &Path) -> String {
    fs::read(proc_dir.join("cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The machine a run happened on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub mem_total_mb: u64,
    pub kernel: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_total_mb = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            / 1024;
        Self {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_model,
            mem_total_mb,
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let s = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut v = s.split_whitespace().filter_map(|x| x.parse().ok());
    [
        v.next().unwrap_or(0.0),
        v.next().unwrap_or(0.0),
        v.next().unwrap_or(0.0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_the_machine_has_cores() {
        let me = sample(std::process::id()).expect("own /proc entry");
        assert!(me.rss_kb > 0 && me.hwm_kb >= me.rss_kb, "{me:?}");
        let (busy, total) = machine_ticks().expect("/proc/stat");
        assert!(total >= busy && total > 0);
        assert!(Machine::read().cores >= 1);
        assert!(sample(u32::MAX).is_none());
    }
}
