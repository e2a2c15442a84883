//! What the two host front ends (`cx3-emu`, `cx3-vfu`) share.
//!
//! The model configuration of node N, the log their messages go to, the processes
//! they watch and the CPU time they report, and their command lines.
//!
//! The command lines are one `clap` definition: the options both take
//! ([`CommonArgs`]: fault injection, trace, exit conditions, statistics,
//! and the fabric with its subnet manager) flattened into each binary's
//! own ([`EmuArgs`], [`VfuArgs`]), with the help `--help` prints generated
//! from it. The fabric's options are read in command-line order by
//! [`FabricOptions::parse_arg`], as the fabric defines them (a later
//! `--topology` or `--back-to-back` wins, fault rules apply in the order
//! given, two different subnet managers are refused).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{ArgMatches, Args, Command, FromArgMatches, Parser};

use crate::fabric::options::{FabricOptions, SmChoice};
use crate::front::in_process::SimConfig;
use crate::hca::config::PortType;
use crate::hca::hcr::{Opcode, Status};

/// The model configuration for node `id`: distinct node and system-image
/// GUIDs per node. (`cx3-emu` replaces the node GUID with the one its
/// fabric's topology gives HCA `id`; the vfio-user front end keeps this
/// one.)
pub fn node_config(id: u32) -> SimConfig {
    let guid = 0x0002_c903_00a1_b2c0 + (u64::from(id) << 8);
    SimConfig {
        node_guid: guid,
        sys_image_guid: guid + 3,
        dma_size: 4096,
        ..SimConfig::default()
    }
}

/// Where messages go: stderr, or a buffer (tests).
#[derive(Debug, Default)]
pub struct Log {
    capture: Option<Vec<String>>,
}

impl Log {
    /// Messages to stderr.
    pub fn stderr() -> Log {
        Log { capture: None }
    }
    /// Messages kept in memory.
    pub fn capture() -> Log {
        Log {
            capture: Some(Vec::new()),
        }
    }
    /// Emits one line.
    pub fn line(&mut self, s: String) {
        match &mut self.capture {
            Some(v) => {
                if v.len() < 100_000 {
                    v.push(s);
                }
            }
            None => eprintln!("{s}"),
        }
    }
    /// The captured lines (empty for stderr).
    pub fn lines(&self) -> &[String] {
        self.capture.as_deref().unwrap_or(&[])
    }
}

/// True while process `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(st) => st
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Sets this thread's timer slack to 1 ns so short sleeps are short.
pub fn set_timer_slack_1ns() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// User plus system CPU time of this process so far.
pub fn process_cpu_time() -> Duration {
    let mut ru = core::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a valid, writable rusage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if r != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded and filled it (and zeroed is valid anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A decimal or `0x` hexadecimal number.
pub fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `RUN_FW`, `2ERR_QP`, `ERR_QP`, `0xff6`, `4086`.
pub fn parse_opcode(s: &str) -> Option<Opcode> {
    let up = s.trim().to_ascii_uppercase();
    if let Some(o) = Opcode::ALL.iter().find(|o| o.name() == up) {
        return Some(*o);
    }
    match up.as_str() {
        "ERR_QP" => return Some(Opcode::ERR_QP),
        "RST_QP" => return Some(Opcode::RST_QP),
        _ => {}
    }
    parse_num(s)
        .filter(|n| *n <= 0xfff)
        .map(|n| Opcode(n as u16))
}

/// `INTERNAL_ERR`, `CMD_STAT_BAD_PARAM`, `3`, `0x0c`.
pub fn parse_status(s: &str) -> Option<Status> {
    let up = s.trim().to_ascii_uppercase();
    let name = up.strip_prefix("CMD_STAT_").unwrap_or(&up);
    if let Some(st) = (0..=255u8).map(Status).find(|st| st.name() == name) {
        return Some(st);
    }
    parse_num(s).and_then(|n| u8::try_from(n).ok()).map(Status)
}

// ---------------------------------------------------------------------------
// The command lines

/// `cx3-emu`'s command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "cx3-emu",
    about = "Serves the ConnectX-3 model to QEMU guests over ivshmem (docs/ivshmem.md).",
    override_usage = "cx3-emu [OPTIONS] --node WINDOW_FILE,RAM_FILE [--node WINDOW_FILE,RAM_FILE ...]",
    after_help = EMU_AFTER_HELP,
    args_override_self = true,
    mut_arg("sm", |a| a.help(SM_HELP_NONE)),
    mut_arg("sm_dir", |a| a.help(SM_DIR_HELP_EMU)),
)]
pub struct EmuArgs {
    /// One guest: its 16 MiB window file and its RAM file; node ids 0, 1,
    /// ... in order.
    #[arg(
        long = "node",
        value_name = "WINDOW_FILE,RAM_FILE",
        required = true,
        value_parser = parse_node_files
    )]
    pub nodes: Vec<(PathBuf, PathBuf)>,
    /// Spin N µs after the last activity.
    #[arg(long = "spin-us", value_name = "N", default_value = "5", value_parser = micros(1_000_000, ""))]
    pub spin: Duration,
    /// ... but N µs once work comes back within N µs of a pause: each
    /// request of a request/response exchange is taken at once, not after a
    /// nap (0: off; worth it only with a core to spare for the emulator).
    #[arg(long = "busy-spin-us", value_name = "N", default_value = "0", value_parser = micros(1_000_000, ""))]
    pub busy_spin: Duration,
    /// Then sleep N µs per round, 1 ns timer slack.
    #[arg(long = "sleep-us", value_name = "N", default_value = "20", value_parser = micros(5000, HEARTBEAT))]
    pub sleep: Duration,
    /// After N ms without activity ...
    #[arg(long = "idle-after-ms", value_name = "N", default_value = "100", value_parser = millis(3_600_000))]
    pub idle_after: Duration,
    /// ... sleep N µs per round instead; the first command after a long
    /// idle spell waits up to this long.
    #[arg(long = "idle-sleep-us", value_name = "N", default_value = "1000", value_parser = micros(5000, HEARTBEAT))]
    pub idle_sleep: Duration,
    /// What both front ends take.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `cx3-vfu`'s command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "cx3-vfu",
    about = "Serves the ConnectX-3 model as PCI functions (15b3:1003), one per socket, to \
             QEMU vfio-user-pci clients (docs/vfio-user.md), all on one emulated fabric:\n  \
             -device '{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"PATH\",\"type\":\"unix\"}}'\n\
             with guest RAM shared (memory-backend-memfd or -file, share=on).",
    override_usage = "cx3-vfu [OPTIONS] --socket PATH [--socket PATH ...]",
    after_help = VFU_AFTER_HELP,
    args_override_self = true,
    mut_arg("sm", |a| a.help(SM_HELP_OPENSM)),
    mut_arg("sm_dir", |a| a.help(SM_DIR_HELP_VFU)),
)]
pub struct VfuArgs {
    /// A UNIX socket to listen on (must not exist); repeat for more nodes:
    /// node 0, 1, ... in order (at most 36).
    #[arg(long = "socket", value_name = "PATH", required = true, value_parser = parse_socket)]
    pub sockets: Vec<PathBuf>,
    /// With one socket: its node id (GUIDs as cx3-emu's node N; default 0).
    #[arg(long, value_name = "N", value_parser = parse_node_id)]
    pub node: Option<u32>,
    /// GO stays set N µs after a post.
    #[arg(long = "hcr-delay-us", value_name = "N", default_value = "0", value_parser = micros(10_000_000, ""))]
    pub hcr_delay: Duration,
    /// Trap BAR2 (the UAR pages) access by access, as BAR0 is: every
    /// doorbell a message, acted on when it arrives (the exact checker;
    /// default: the UAR pages are memory the guest maps and the model polls).
    #[arg(long = "trap-uar", help_heading = POLL)]
    pub trap_uar: bool,
    /// Spin N µs after the last doorbell or packet (mapped UAR pages).
    #[arg(long = "spin-us", value_name = "N", default_value = "5", value_parser = micros(1_000_000, ""), help_heading = POLL)]
    pub spin: Duration,
    /// ... but N µs once work comes back within N µs of a pause (0: off;
    /// worth it only with a core to spare).
    #[arg(long = "busy-spin-us", value_name = "N", default_value = "0", value_parser = micros(1_000_000, ""), help_heading = POLL)]
    pub busy_spin: Duration,
    /// Then sleep N µs per round, 1 ns timer slack.
    #[arg(long = "sleep-us", value_name = "N", default_value = "20", value_parser = micros(5000, ""), help_heading = POLL)]
    pub sleep: Duration,
    /// After N ms without activity ...
    #[arg(long = "idle-after-ms", value_name = "N", default_value = "100", value_parser = millis(3_600_000), help_heading = POLL)]
    pub idle_after: Duration,
    /// ... sleep N µs per round instead; the first doorbell after a long
    /// idle spell waits up to this long.
    #[arg(long = "idle-sleep-us", value_name = "N", default_value = "1000", value_parser = micros(5000, ""), help_heading = POLL)]
    pub idle_sleep: Duration,
    /// What both front ends take.
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The options both front ends take besides their own.
#[derive(Args, Debug, Clone, Default)]
pub struct CommonArgs {
    /// Fault injection, trace, exit conditions, statistics.
    #[command(flatten)]
    pub host: HostOptions,
    /// The fabric and its subnet manager.
    #[command(flatten)]
    pub fabric: FabricArgs,
}

/// What both front ends do beside serving: fail commands, raise a
/// catastrophic error, trace, exit, count.
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct HostOptions {
    /// Every command CMD (a name such as RUN_FW, or an opcode such as
    /// 0xff6) completes with STATUS (a CMD_STAT name such as INTERNAL_ERR
    /// or BAD_PARAM, or a number; default INTERNAL_ERR); repeatable.
    #[arg(long, value_name = "CMD[=STATUS]", value_parser = parse_fail)]
    pub fail: Vec<(Opcode, Status)>,
    /// Raise a catastrophic error on every node SECS seconds (fractions
    /// allowed) after its first successful INIT_HCA.
    #[arg(long, value_name = "SECS", value_parser = parse_catas_after)]
    pub catas_after: Option<Duration>,
    /// Print every firmware command on stderr, after its node's number.
    #[arg(long, help = "Print every firmware command on stderr (node<N>: ...)")]
    pub trace: bool,
    /// Exit when the parent process is gone.
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Exit when PID is gone (repeatable: when all are gone).
    #[arg(long = "watch-pid", value_name = "PID", value_parser = parse_watch_pid)]
    pub watch_pids: Vec<u32>,
    /// At exit, print the counts of every node and their total (commands,
    /// violations, DMA faults; cx3-vfu adds accesses and interrupts) and
    /// the CPU time used.
    #[arg(long)]
    pub stats: bool,
    /// What every node's ports are, as a VPI card's LINK_TYPE: ib, eth or
    /// auto (either: the driver picks, SENSE_PORT tells the cable's), one
    /// for both ports or P1,P2 (default: the link layer of each port's
    /// cable, --link-layer).
    #[arg(long, value_name = "TYPE[,TYPE]", value_parser = parse_port_types)]
    pub port_type: Option<[PortType; 2]>,
}

/// `--port-type TYPE[,TYPE]`.
pub fn parse_port_types(value: &str) -> Result<[PortType; 2], String> {
    PortType::parse_pair(value).ok_or(format!(
        "wants ib, eth or auto, or two of them separated by a comma, got {value:?}"
    ))
}

/// The fabric every node is cabled to and its subnet manager, as
/// [`FabricOptions::parse_arg`] takes them one by one in command-line
/// order (its options are declared by [`FabricFlags`]). The subnet
/// manager defaults to none; `cx3-vfu` makes it OpenSM.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FabricArgs(pub FabricOptions);

/// The fabric's options as the command line declares them (help, value
/// names, how many values); their values are read by [`FabricArgs`].
#[derive(Args, Debug, Clone, Default)]
pub struct FabricFlags {
    /// Two nodes, port 1 to port 1 (default: one 36-port switch with every
    /// node's port 1).
    #[arg(long, help_heading = FABRIC)]
    pub back_to_back: bool,
    /// An ibsim net file (Switch/Ca entries, GUIDs, links).
    #[arg(long, value_name = "FILE", help_heading = FABRIC)]
    pub topology: Vec<String>,
    /// The link layer of every node's ports: ib (default), eth (port 1 on
    /// an Ethernet switch; RoCE and mlx4_en), or P1,P2 such as ib,eth
    /// (port 1 on the InfiniBand switch, port 2 on the Ethernet switch);
    /// docs/ethernet.md.
    #[arg(long, value_name = "LL[,LL]", help_heading = FABRIC)]
    pub link_layer: Vec<String>,
    /// Every packet on every cable to FILE (pcapng, or classic pcap with
    /// ERF records for a .pcap name).
    #[arg(long, value_name = "FILE", help_heading = FABRIC)]
    pub capture: Vec<String>,
    /// Wire latency per cable (e.g. 2us).
    #[arg(long, value_name = "TIME", help_heading = FABRIC)]
    pub latency: Vec<String>,
    /// Lose the packets SPEC selects (rate=P, every=N, qpn=, opcode=,
    /// port=NODE/PORT, times=N, from=TIME, until=TIME;
    /// docs/fabric.md); repeatable.
    #[arg(long, value_name = "SPEC", help_heading = FABRIC)]
    pub drop: Vec<String>,
    /// Flip a bit of the packets SPEC selects; repeatable.
    #[arg(long, value_name = "SPEC", help_heading = FABRIC)]
    pub corrupt: Vec<String>,
    /// Hold the packets SPEC selects for TIME; repeatable.
    #[arg(long, value_name = "TIME[,SPEC]", help_heading = FABRIC)]
    pub delay: Vec<String>,
    /// Pull a cable at T (a fabric time, or a byte count such as 64MiB
    /// crossing that cable), put it back D later; repeatable.
    #[arg(long, value_name = "NODE/PORT@T[+D]", help_heading = FABRIC)]
    pub pull: Vec<String>,
    /// Seed of the fault RNG.
    #[arg(long, value_name = "N", help_heading = FABRIC)]
    pub fault_seed: Vec<String>,
    /// The subnet manager (each binary says its own default).
    #[arg(long, value_name = "SM", value_parser = ["opensm", "embedded", "none"], help_heading = SM)]
    pub sm: Vec<String>,
    /// The same as --sm embedded.
    #[arg(long, help_heading = SM)]
    pub embedded_sm: bool,
    /// OpenSM's log (DIR/opensm.log), cache and dumps (each binary says its
    /// own default).
    #[arg(long, value_name = "DIR", help_heading = SM)]
    pub sm_dir: Vec<String>,
    /// OpenSM's options, words separated by spaces or commas (default
    /// "-s 1": a sweep every second).
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true, help_heading = SM)]
    pub opensm_args: Vec<String>,
    /// Write the ibsim socket name there (scripts/ib-host.sh reads
    /// target/fabric/ibsim-sockname); removed at exit.
    #[arg(long, value_name = "FILE", help_heading = SM)]
    pub sockname_file: Vec<String>,
}

const FABRIC: &str = "Fabric";
const POLL: &str = "Polling the UAR pages";
const SM: &str = "Subnet manager (docs/peers.md)";
const HEARTBEAT: &str = " (the heartbeat must move every 10 ms)";
const SM_HELP_NONE: &str = "opensm: Debian's OpenSM as a child process, attached through \
    ibsim's protocol at host node smhost (the switch's last free port); embedded: the \
    fabric's own SM and SA (first free switch port); none (the default): no SM. Every \
    choice also serves ibsim's protocol (socket lego-<pid>-0) for the diags \
    (scripts/ib-host.sh)";
const SM_HELP_OPENSM: &str = "opensm (the default): Debian's OpenSM on a host node of the \
    fabric, attached through ibsim's protocol; embedded: the fabric's own SM and SA; none: \
    no SM (the ibsim server still runs for the diags)";
const SM_DIR_HELP_EMU: &str = "OpenSM's log (DIR/opensm.log), cache and dumps (default: \
    cx3-emu-PID in the temporary directory)";
const SM_DIR_HELP_VFU: &str = "OpenSM's log (DIR/opensm.log), cache and dumps (default: a \
    temporary directory, removed at exit)";
const EMU_AFTER_HELP: &str = "\
One fabric spans every node: node i is HCA i of the topology, port 1 cabled, port 2
uncabled unless a topology file says otherwise.

Exits 0 when every guest has written state 3, on SIGINT/SIGTERM/SIGHUP, or when the
watched processes (or the parent) are gone; 2 on a usage or file error. Violations, DMA
faults and the trace go to stderr, prefixed node<N>:.";
const VFU_AFTER_HELP: &str = "\
One fabric spans every node: node i is HCA i of the topology, port 1 cabled, port 2
uncabled unless a topology file says otherwise.

Exits 0 when every client has disconnected, on SIGINT/SIGTERM/SIGHUP, or when the
watched processes (or the parent) are gone; 2 on a usage error or when a socket cannot
be created. Violations, DMA faults and the trace go to stderr, prefixed node<N>:.";

impl Args for FabricArgs {
    fn augment_args(cmd: Command) -> Command {
        FabricFlags::augment_args(cmd)
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        FabricFlags::augment_args_for_update(cmd)
    }
}

impl FromArgMatches for FabricArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut a = FabricArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    /// Every fabric option given, in command-line order, through
    /// [`FabricOptions::parse_arg`].
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        let flags = FabricFlags::augment_args(Command::new(""));
        let mut given: Vec<(usize, String, Option<String>)> = Vec::new();
        for arg in flags.get_arguments() {
            let id = arg.get_id().as_str();
            let (Some(long), Some(at)) = (arg.get_long(), m.indices_of(id)) else {
                continue;
            };
            if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
                continue;
            }
            let flag = format!("--{long}");
            if arg.get_action().takes_values() {
                let values = m.get_raw(id).into_iter().flatten();
                for (i, v) in at.zip(values) {
                    given.push((i, flag.clone(), Some(v.to_string_lossy().into_owned())));
                }
            } else if m.get_flag(id) {
                given.extend(at.map(|i| (i, flag.clone(), None)));
            }
        }
        given.sort_by_key(|g| g.0);
        for (_, flag, value) in given {
            match self.0.parse_arg(&flag, value.as_deref()) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(clap::Error::raw(
                        ErrorKind::UnknownArgument,
                        format!("{flag}: not a fabric option"),
                    ));
                }
                Err(e) => return Err(clap::Error::raw(ErrorKind::ValueValidation, e)),
            }
        }
        Ok(())
    }
}

/// Parses `cx3-emu`'s command line (without the program name).
pub fn parse_emu_args<I, T>(args: I) -> Result<EmuArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    EmuArgs::try_parse_from(
        std::iter::once(OsString::from("cx3-emu")).chain(args.into_iter().map(Into::into)),
    )
}

/// Parses `cx3-vfu`'s command line (without the program name): OpenSM
/// unless `--sm` (or `--embedded-sm`) says otherwise, distinct sockets, at
/// most 36 of them, `--node` only with one.
pub fn parse_vfu_args<I, T>(args: I) -> Result<VfuArgs, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut a = VfuArgs::try_parse_from(
        std::iter::once(OsString::from("cx3-vfu")).chain(args.into_iter().map(Into::into)),
    )?;
    let refuse = |msg: String| {
        use clap::CommandFactory;
        Err(VfuArgs::command().error(ErrorKind::ValueValidation, msg))
    };
    for (i, s) in a.sockets.iter().enumerate() {
        if a.sockets[..i].contains(s) {
            return refuse(format!("--socket {}: named twice", s.display()));
        }
    }
    if a.sockets.len() > 36 {
        return refuse(format!("{} sockets: at most 36 nodes", a.sockets.len()));
    }
    if a.node.is_some() && a.sockets.len() > 1 {
        return refuse("--node names the node of a single --socket".into());
    }
    let f = &mut a.common.fabric.0;
    if !f.sm_given {
        f.sm = SmChoice::OpenSm;
    }
    Ok(a)
}

/// What a binary does with a command line it could not take: `--help`
/// on stdout (exit 0), anything else on stderr after the binary's name
/// (exit 2).
pub fn usage_exit(bin: &str, e: &clap::Error) -> ExitCode {
    if !e.use_stderr() {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.render().to_string();
    eprint!("{bin}: {}", text.strip_prefix("error: ").unwrap_or(&text));
    ExitCode::from(2)
}

/// `--node WINDOW_FILE,RAM_FILE` of cx3-emu.
fn parse_node_files(value: &str) -> Result<(PathBuf, PathBuf), String> {
    value
        .split_once(',')
        .filter(|(w, r)| !w.is_empty() && !r.is_empty())
        .map(|(w, r)| (PathBuf::from(w), PathBuf::from(r)))
        .ok_or(format!("wants WINDOW_FILE,RAM_FILE, got {value:?}"))
}

/// `--socket PATH` of cx3-vfu.
fn parse_socket(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err("wants a path".into());
    }
    Ok(PathBuf::from(value))
}

/// `--node N` of cx3-vfu.
fn parse_node_id(value: &str) -> Result<u32, String> {
    parse_num(value)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n < 256)
        .ok_or(format!("wants 0..=255, got {value:?}"))
}

/// A number of microseconds up to `max` (`why`: the reason for the limit).
fn micros(
    max: u64,
    why: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |value| {
        parse_num(value)
            .filter(|n| *n <= max)
            .map(Duration::from_micros)
            .ok_or(format!("wants 0..={max} microseconds{why}, got {value:?}"))
    }
}

/// A number of milliseconds up to `max`.
fn millis(max: u64) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |value| {
        parse_num(value)
            .filter(|n| *n <= max)
            .map(Duration::from_millis)
            .ok_or(format!("wants 0..={max} milliseconds, got {value:?}"))
    }
}

/// `--fail CMD[=STATUS]` (the status defaults to INTERNAL_ERR).
pub fn parse_fail(value: &str) -> Result<(Opcode, Status), String> {
    let (c, st) = match value.split_once('=') {
        Some((c, st)) => (c, Some(st)),
        None => (value, None),
    };
    let op = parse_opcode(c).ok_or(format!("unknown command {c:?}"))?;
    let st = match st {
        Some(st) => parse_status(st).ok_or(format!("unknown status {st:?}"))?,
        None => Status::INTERNAL_ERR,
    };
    Ok((op, st))
}

/// `--catas-after SECONDS`.
pub fn parse_catas_after(value: &str) -> Result<Duration, String> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or(format!("wants seconds, got {value:?}"))
}

/// `--watch-pid PID`.
pub fn parse_watch_pid(value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or(format!("wants a process id, got {value:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::faults::{FaultKind, PullAt};
    use crate::fabric::options::TopologyChoice;
    use crate::front::{ivshmem, vfu};

    /// `$emu_args` as bash splits it in run-qemu.sh and vfu-run.sh.
    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// run-qemu.sh's `emu_cmd` for two nodes under OpenSM.
    const RUN_QEMU: &str = "--exit-with-parent --sm opensm --sm-dir /r/target/fabric/run-7 \
        --sockname-file /r/target/fabric/ibsim-sockname \
        --node /dev/shm/lego/cx3-7-node0.win,/dev/shm/lego/cx3-7-node0.ram \
        --node /dev/shm/lego/cx3-7-node1.win,/dev/shm/lego/cx3-7-node1.ram";

    /// vfu-run.sh's `vfu_cmd` for two nodes (no `--sm`: cx3-vfu's default).
    const VFU_RUN: &str = "--exit-with-parent --sm-dir /r/target/fabric/vfu-9/opensm \
        --sockname-file /r/target/fabric/ibsim-sockname \
        --socket /tmp/cx3-vfu-run-9/node0.sock --socket /tmp/cx3-vfu-run-9/node1.sock";

    fn emu(extra: &str) -> Result<EmuArgs, clap::Error> {
        parse_emu_args(words(&format!("{RUN_QEMU} {extra}")))
    }

    fn vfu(extra: &str) -> Result<VfuArgs, clap::Error> {
        parse_vfu_args(words(&format!("{VFU_RUN} {extra}")))
    }

    /// The lines run-qemu.sh builds, with the `--emu-args` that scripts,
    /// docs and the QEMU tests pass (qemu_hca, qemu_tools, qemu_rmem,
    /// qemu_subnet, qemu_linux, bench-perftest.sh, docs/tools.md).
    #[test]
    fn run_qemu_command_lines() {
        let a = emu("").unwrap();
        assert_eq!(a.nodes.len(), 2);
        assert_eq!(
            a.nodes[1],
            (
                PathBuf::from("/dev/shm/lego/cx3-7-node1.win"),
                PathBuf::from("/dev/shm/lego/cx3-7-node1.ram")
            )
        );
        let f = &a.common.fabric.0;
        assert!(a.common.host.exit_with_parent);
        assert_eq!(f.sm, SmChoice::OpenSm);
        assert_eq!(f.sm_dir, Some("/r/target/fabric/run-7".into()));
        assert_eq!(
            f.sockname_file,
            Some("/r/target/fabric/ibsim-sockname".into())
        );
        assert_eq!(
            emu("--fail RUN_FW").unwrap().common.host.fail,
            vec![(Opcode::RUN_FW, Status::INTERNAL_ERR)]
        );
        assert_eq!(
            emu("--catas-after 0.5").unwrap().common.host.catas_after,
            Some(Duration::from_millis(500))
        );
        assert!(emu("--stats").unwrap().common.host.stats);
        assert!(emu("--trace").unwrap().common.host.trace);
        assert_eq!(
            emu("--busy-spin-us 200").unwrap().busy_spin,
            Duration::from_micros(200)
        );
        let a = emu(
            "--drop opcode=0x07,every=13,times=6 --drop opcode=0x11,every=7,times=6 \
             --pull node1/1@64MiB",
        )
        .unwrap();
        let faults = &a.common.fabric.0.faults;
        let opcodes: Vec<_> = faults.rules.iter().map(|r| r.rule.matcher.opcode).collect();
        assert_eq!(opcodes, vec![Some(0x07), Some(0x11)]);
        assert_eq!(faults.pulls.len(), 1);
        assert_eq!(faults.pulls[0].at, PullAt::Bytes(64 << 20));
        let a = emu("--pull node2/1@16MiB").unwrap();
        assert_eq!(a.common.fabric.0.faults.pulls[0].port.node, "node2");
        // run-qemu.sh passes its --sm and the --emu-args asking for the
        // same SM (it refuses two different ones itself).
        let embedded = RUN_QEMU.replace("--sm opensm", "--sm embedded");
        let a = parse_emu_args(words(&format!("{embedded} --embedded-sm"))).unwrap();
        assert_eq!(a.common.fabric.0.sm, SmChoice::Embedded);
        assert_eq!(
            emu("--sm=opensm").unwrap().common.fabric.0.sm,
            SmChoice::OpenSm
        );
        let none = RUN_QEMU.replace("--sm opensm", "--sm none");
        let a = parse_emu_args(words(&format!("{none} --stats"))).unwrap();
        assert_eq!(a.common.fabric.0.sm, SmChoice::None);
        // What cx3-emu refuses stops the run (qemu_hca).
        assert_eq!(
            emu("--bogus").unwrap_err().kind(),
            ErrorKind::UnknownArgument
        );
        let e = emu("--embedded-sm").unwrap_err();
        assert!(e.to_string().contains("two subnet managers"), "{e}");
    }

    /// The lines vfu-run.sh builds (`run-qemu.sh --vfu`/`--linux`), with
    /// the `--emu-args` the QEMU tests and docs/vfio-user.md pass.
    #[test]
    fn vfu_run_command_lines() {
        let a = vfu("").unwrap();
        assert_eq!(a.sockets.len(), 2);
        assert_eq!(a.node, None);
        assert_eq!(a.common.fabric.0.sm, SmChoice::OpenSm, "OpenSM by default");
        assert!(!a.common.fabric.0.sm_given);
        assert_eq!(
            a.common.fabric.0.sm_dir,
            Some("/r/target/fabric/vfu-9/opensm".into())
        );
        let a = vfu("--sm embedded --stats").unwrap();
        assert_eq!(a.common.fabric.0.sm, SmChoice::Embedded);
        assert!(a.common.host.stats);
        let a = vfu("--sm none --fail QUERY_DEV_CAP=BAD_PARAM").unwrap();
        assert_eq!(a.common.fabric.0.sm, SmChoice::None);
        assert_eq!(
            a.common.host.fail,
            vec![(Opcode::QUERY_DEV_CAP, Status::BAD_PARAM)]
        );
        let a = vfu("--trace --fail DIAG_RPRT=BAD_OP").unwrap();
        assert!(a.common.host.trace);
        assert_eq!(
            a.common.host.fail,
            vec![(Opcode::DIAG_RPRT, Status::BAD_OP)]
        );
        assert!(vfu("--socket /tmp/cx3-vfu-run-9/node0.sock").is_err());
    }

    /// A later `--topology` or `--back-to-back` wins, and fault rules keep
    /// the order they were given in, across the three kinds.
    #[test]
    fn fabric_options_keep_command_line_order() {
        let a = parse_emu_args(words(
            "--node w,r --corrupt every=3 --drop rate=0.5 --delay 10us --back-to-back \
             --topology net.txt",
        ))
        .unwrap();
        let f = &a.common.fabric.0;
        let kinds: Vec<_> = f.faults.rules.iter().map(|r| r.rule.kind).collect();
        assert_eq!(
            kinds,
            vec![
                FaultKind::Corrupt,
                FaultKind::Drop,
                FaultKind::Delay(10_000)
            ]
        );
        assert_eq!(f.topology, TopologyChoice::File("net.txt".into()));
        let a = parse_emu_args(words("--node w,r --topology net.txt --back-to-back")).unwrap();
        assert_eq!(a.common.fabric.0.topology, TopologyChoice::BackToBack);
        let a = parse_emu_args(words("--node w,r --spin-us 3 --spin-us 4")).unwrap();
        assert_eq!(a.spin, Duration::from_micros(4), "the last one counts");
    }

    /// The command lines' defaults are the front ends' `Options::default()`
    /// (the tests build those).
    #[test]
    fn command_line_defaults_are_the_options_defaults() {
        let (_, o) = ivshmem::parse_args(["--node", "w,r"]).unwrap();
        let d = ivshmem::Options::default();
        assert_eq!(
            (o.spin, o.busy_spin, o.sleep, o.idle_after, o.idle_sleep),
            (d.spin, d.busy_spin, d.sleep, d.idle_after, d.idle_sleep)
        );
        assert_eq!((o.host, o.fabric), (d.host, d.fabric));
        let (_, node, o) = vfu::parse_args(["--socket", "s"]).unwrap();
        let d = vfu::Options::default();
        assert_eq!(node, 0);
        assert_eq!((o.hcr_delay, o.host), (d.hcr_delay, d.host));
        assert_eq!(o.poll, d.poll);
        let opensm = FabricOptions {
            sm: SmChoice::OpenSm,
            ..*d.fabric
        };
        assert_eq!(*o.fabric, opensm);
    }
}
