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
    stat(pid).map(|s| s.cpu)
}

/// What `/proc/<pid>/stat` says of a process's parent and CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    /// User + system time of all its threads, clock ticks.
    cpu: u64,
    /// User + system time of its children that exited and were waited for (`cutime + cstime`).
    children: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is index 0: ppid (4) is 1, utime, stime, cutime, cstime (14–17) are 11–14.
    let n = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Stat {
        ppid: n(1)? as u32,
        cpu: n(11)? + n(12)?,
        children: n(13)? + n(14)?,
    })
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
    /// The run's database, whose backends count; [`Servers::postgres_now`] finds PostgreSQL's processes
    /// at each reading.
    pg_database: String,
    /// SecantusDB, the Python MongoDB-wire server.
    pub mongo: Vec<u32>,
}

impl Servers {
    /// The NATS server listening on `nats_port` and the SecantusDB on `mongo_port`; PostgreSQL as used by
    /// database `pg_database` is looked for at each reading.
    pub fn find(nats_port: u16, mongo_port: u16, pg_database: &str) -> Self {
        let mut s = Self {
            pg_database: pg_database.to_owned(),
            ..Self::default()
        };
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
            } else if comm.starts_with("python") {
                let cmd = cmdline(&entry.path());
                if cmd.contains("secantus") && on_port(&cmd, mongo_port) {
                    s.mongo.push(pid);
                }
            }
        }
        s
    }

    /// CPU ticks of NATS and of SecantusDB (single processes that live as long as the stack).
    pub fn ticks(&self) -> [u64; 2] {
        let sum = |pids: &[u32]| pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
        [sum(&self.nats), sum(&self.mongo)]
    }

    /// PostgreSQL's processes now, found again: backends come and go (a pool opens one, an autovacuum
    /// worker runs for a second), so a list made once at the start misses the new ones and loses what a
    /// vanished one had used.
    pub fn postgres_now(&self) -> PgSnapshot {
        PgSnapshot::read(&self.pg_database)
    }
}

/// PostgreSQL's processes a run involves at one moment, each with its CPU so far: the backends of the run's
/// database, and the postmaster and its other children (checkpointer, WAL writer, autovacuum launcher and
/// workers, …) but not the backends of other databases.
#[derive(Clone, Debug, Default)]
pub struct PgSnapshot {
    /// pid → (CPU ticks so far, whether it is a backend of the run's database).
    procs: std::collections::HashMap<u32, (u64, bool)>,
    /// The postmaster's children that exited, their CPU ticks together (`cutime + cstime`): closed
    /// connections (of any database) and finished autovacuum workers.
    exited: u64,
    /// The run's postmaster, when its backends were found.
    master: Option<u32>,
}

/// PostgreSQL's CPU over a window, clock ticks, by kind of process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgCpu {
    /// Backends of the run's database alive at the end.
    pub backends: u64,
    /// The postmaster and its background processes alive at the end.
    pub background: u64,
    /// Processes that exited within the window (whatever they were), from their start or the window's.
    pub exited: u64,
}

impl PgCpu {
    pub fn total(&self) -> u64 {
        self.backends + self.background + self.exited
    }
}

impl PgSnapshot {
    fn read(pg_database: &str) -> Self {
        // (pid, stat, a backend, a backend of the run's database)
        let mut postgres: Vec<(u32, Stat, bool, bool)> = Vec::new();
        let Ok(dir) = fs::read_dir("/proc") else {
            return Self::default();
        };
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if fs::read_to_string(entry.path().join("comm"))
                .unwrap_or_default()
                .trim()
                != "postgres"
            {
                continue;
            }
            let cmd = cmdline(&entry.path());
            // A backend's title names its database and client; background processes name neither.
            let backend = cmd.contains('(') || cmd.contains("[local]");
            if let Some(st) = stat(pid) {
                postgres.push((pid, st, backend, backend && cmd.contains(pg_database)));
            }
        }
        // The run's postmaster is its backends' parent.
        let Some(master) = postgres.iter().find(|p| p.3).map(|p| p.1.ppid) else {
            return Self::default();
        };
        let mut s = Self {
            master: Some(master),
            ..Self::default()
        };
        for (pid, st, backend, ours) in postgres {
            if pid == master {
                s.exited = st.children;
                s.procs.insert(pid, (st.cpu, false));
            } else if st.ppid == master && (ours || !backend) {
                s.procs.insert(pid, (st.cpu, ours));
            }
        }
        s
    }

    /// The CPU used between `before` and this reading. A process alive at both counts its difference; one
    /// new since counts all it used; one gone since is in the postmaster's exited children, less what it
    /// had used at `before`. None unless both readings found the same postmaster: without one there is
    /// nothing to subtract from, and a restarted server's processes began anew.
    pub fn since(&self, before: &PgSnapshot) -> Option<PgCpu> {
        if self.master.is_none() || self.master != before.master {
            return None;
        }
        let mut cpu = PgCpu::default();
        for (pid, (t, backend)) in &self.procs {
            let d = t.saturating_sub(before.procs.get(pid).map_or(0, |b| b.0));
            if *backend {
                cpu.backends += d;
            } else {
                cpu.background += d;
            }
        }
        let gone: u64 = before
            .procs
            .iter()
            .filter(|(pid, _)| !self.procs.contains_key(pid))
            .map(|(_, (t, _))| *t)
            .sum();
        cpu.exited = self
            .exited
            .saturating_sub(before.exited)
            .saturating_sub(gone);
        Some(cpu)
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

    /// A backend that ran throughout counts its difference, a new one all it used, one that ended what it
    /// used after the first reading, and an autovacuum worker that came and went within the window all of
    /// it (through the postmaster's exited children).
    #[test]
    fn postgres_cpu_counts_processes_that_came_and_went() {
        let snap = |procs: &[(u32, u64, bool)], exited| PgSnapshot {
            procs: procs.iter().map(|&(p, t, b)| (p, (t, b))).collect(),
            exited,
            master: Some(9),
        };
        let before = snap(&[(1, 10, true), (2, 5, false), (3, 7, true)], 100);
        // 3 ended at 9 ticks; an autovacuum worker used 4 and ended; 4 is a new backend at 3.
        let after = snap(&[(1, 15, true), (2, 6, false), (4, 3, true)], 100 + 9 + 4);
        let cpu = after.since(&before).expect("one postmaster");
        assert_eq!(
            cpu,
            PgCpu {
                backends: 5 + 3,
                background: 1,
                exited: 2 + 4,
            }
        );
        assert_eq!(cpu.total(), 15);
        // No postmaster at the start, or another one at the end (a restart): no figure.
        let none = PgSnapshot::default();
        assert_eq!(after.since(&none), None);
        let restarted = PgSnapshot {
            master: Some(10),
            ..after.clone()
        };
        assert_eq!(restarted.since(&before), None);
    }

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
