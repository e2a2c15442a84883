//! The fabric's command-line options.
//!
//! The fabric's command-line options for cx3-emu (and `run-qemu.sh
//! --emu-args`): the topology (`--topology FILE` in ibsim's net format,
//! `--back-to-back`; otherwise one switch for the nodes), the link layer
//! of the nodes' ports (`--link-layer ib|eth|ib,eth`: which switch each
//! port is cabled to, see [`Topology::for_nodes_with`]), `--capture
//! FILE` (pcapng, or classic pcap for a `.pcap` name), `--latency TIME`,
//! and the packet faults (`--drop`, `--corrupt`, `--delay`, `--pull`,
//! `--fault-seed`, see [`super::faults::FaultOptions`]), and the subnet
//! manager: `--sm opensm|embedded|none` (`--embedded-sm` is `--sm
//! embedded`), `--sm-dir DIR`, `--opensm-args ARGS`, `--sockname-file
//! FILE`. The command line itself belongs to the front ends (one `clap`
//! definition for both binaries); this only parses values and builds the
//! fabric and its SM from them. The OpenSM
//! process itself is [`super::ibsim::SmService`]'s; OpenSM options beyond
//! a word list and remote (UDP) ibsim clients are left out.
//!
//! Use: for each `--flag value` pair call [`FabricOptions::parse_arg`]
//! (it says whether it took the flag), then [`FabricOptions::build`]
//! with the number of nodes; node i of the emulator is HCA i of the
//! returned [`Built`] (its node GUID and the fabric ports of its ports 1
//! and 2). Then [`FabricOptions::start_sm`] on the built fabric starts
//! the ibsim server (where OpenSM and the diags attach) and, for `--sm
//! opensm`, OpenSM; the front end polls the returned service each round
//! of its main loop and stops it on the way out.
//!
//! The SM choices:
//! * `opensm`: Debian's OpenSM under the umad2sim preload on the host
//!   node `smhost` (the switch's last free port), started with
//!   [`DEFAULT_OPENSM_ARGS`] unless `--opensm-args` says otherwise.
//! * `embedded`: the fabric's own SM ([`super::sm`]) on the first free
//!   switch port, and the ibsim server for the diags.
//! * `none`: no SM; the ibsim server still runs, so a user can attach
//!   the diags or an OpenSM of their own (`scripts/ib-host.sh opensm`).
//!
//! The server needs a switch with a free port; without one (`--back-to
//! -back`) `none` runs without it and the other two are refused.

use std::path::PathBuf;

use std::time::Duration;

use super::faults::{FaultOptions, PullAt, parse_time};
use super::ibsim::{SmOptions, SmService};
use super::{Built, Capture, Fabric, LinkLayer, Topology};

/// OpenSM's options unless `--opensm-args` replaces them: a sweep every
/// second (`-s 1`), so a guest whose driver comes up after OpenSM's first
/// sweep becomes Active within a second of its QP0 answering; the
/// switch's Trap 128 covers links that come up later.
pub const DEFAULT_OPENSM_ARGS: [&str; 2] = ["-s", "1"];

/// The embedded SM as `--sm embedded` runs it: a light sweep every
/// second, like OpenSM with [`DEFAULT_OPENSM_ARGS`], and after a sweep
/// with errors (a guest whose QP0 went unpolled while its driver refreshed
/// ib_core's port cache) the next one 250 ms later, doubling up to that
/// second, instead of 1 s doubling up to 10 s (a guest then waited up to
/// 19 s for Active).
pub fn embedded_sm_config() -> super::SmConfig {
    super::SmConfig {
        sweep_interval_ns: 1_000_000_000,
        error_resweep_ns: 250_000_000,
        ..super::SmConfig::default()
    }
}

/// The ibsim server's request timeout: how long OpenSM (or a diag) waits
/// for an answer before it is told "timed out" (umad2sim has no timeouts
/// of its own). 1 s, not OpenSM's 200 ms default: a guest under TCG does
/// not poll QP0 while it refreshes ib_core's port cache after a port event
/// (several hundred MAD_IFCs, 0.3 s and more on a loaded machine); at
/// 200 ms OpenSM counted those SMPs lost, failed the sweep and bounced the
/// port (Active, then INIT, then Active again seconds later).
pub const SM_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Which subnet manager runs on the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SmChoice {
    /// None (the ibsim server runs when it can, for the diags).
    #[default]
    None,
    /// The fabric's own SM and SA.
    Embedded,
    /// The real OpenSM, a child process attached through ibsim's protocol.
    OpenSm,
}

impl SmChoice {
    /// `opensm`, `embedded`, `none`.
    pub fn parse(s: &str) -> Option<SmChoice> {
        match s {
            "opensm" => Some(SmChoice::OpenSm),
            "embedded" => Some(SmChoice::Embedded),
            "none" => Some(SmChoice::None),
            _ => None,
        }
    }

    /// The word `--sm` takes.
    pub fn name(self) -> &'static str {
        match self {
            SmChoice::OpenSm => "opensm",
            SmChoice::Embedded => "embedded",
            SmChoice::None => "none",
        }
    }
}

/// Which topology.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TopologyChoice {
    /// N nodes on one switch (the default).
    #[default]
    Switch,
    /// Two nodes, port 1 to port 1.
    BackToBack,
    /// An ibsim net file.
    File(PathBuf),
}

/// Parsed fabric options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FabricOptions {
    /// Topology.
    pub topology: TopologyChoice,
    /// Capture file.
    pub capture: Option<PathBuf>,
    /// Wire latency per cable, nanoseconds.
    pub latency_ns: Option<u64>,
    /// Packet faults and cable pulls.
    pub faults: FaultOptions,
    /// The subnet manager.
    pub sm: SmChoice,
    /// Set once `--sm` or `--embedded-sm` was given (a second, different
    /// choice is refused).
    pub sm_given: bool,
    /// OpenSM's log, cache and dump directory (`--sm-dir`).
    pub sm_dir: Option<PathBuf>,
    /// OpenSM's arguments (`--opensm-args`; default
    /// [`DEFAULT_OPENSM_ARGS`]).
    pub opensm_args: Option<Vec<String>>,
    /// Where to record the ibsim socket name for `scripts/ib-host.sh`.
    pub sockname_file: Option<PathBuf>,
    /// The link layers of every node's ports 1 and 2 (`--link-layer`;
    /// both InfiniBand by default).
    pub link_layers: Option<[LinkLayer; 2]>,
}

impl FabricOptions {
    /// Flags that take a value.
    pub const VALUE_FLAGS: [&'static str; 13] = [
        "--topology",
        "--link-layer",
        "--capture",
        "--latency",
        "--drop",
        "--corrupt",
        "--delay",
        "--pull",
        "--fault-seed",
        "--sm",
        "--sm-dir",
        "--opensm-args",
        "--sockname-file",
    ];

    /// Takes one option (`value` is `None` for a bare flag). `Ok(false)`:
    /// not a fabric option.
    pub fn parse_arg(&mut self, flag: &str, value: Option<&str>) -> Result<bool, String> {
        if flag == "--back-to-back" {
            if value.is_some() {
                return Err("--back-to-back takes no value".into());
            }
            self.topology = TopologyChoice::BackToBack;
            return Ok(true);
        }
        if flag == "--embedded-sm" {
            if value.is_some() {
                return Err("--embedded-sm takes no value".into());
            }
            self.choose_sm(SmChoice::Embedded)?;
            return Ok(true);
        }
        if !Self::VALUE_FLAGS.contains(&flag) {
            return Ok(false);
        }
        let v = value.ok_or_else(|| format!("{flag} needs a value"))?;
        match flag {
            "--topology" => self.topology = TopologyChoice::File(PathBuf::from(v)),
            "--link-layer" => {
                self.link_layers = Some(parse_link_layers(v).ok_or_else(|| {
                    format!("--link-layer takes ib, eth or P1,P2 (e.g. ib,eth), not {v:?}")
                })?)
            }
            "--capture" => self.capture = Some(PathBuf::from(v)),
            "--latency" => {
                self.latency_ns = Some(parse_time(v).map_err(|e| format!("--latency {v}: {e}"))?)
            }
            "--sm" => {
                let c = SmChoice::parse(v)
                    .ok_or_else(|| format!("--sm takes opensm, embedded or none, not {v:?}"))?;
                self.choose_sm(c)?;
            }
            "--sm-dir" if v.is_empty() => return Err("--sm-dir needs a directory".into()),
            "--sm-dir" => self.sm_dir = Some(PathBuf::from(v)),
            "--sockname-file" if v.is_empty() => {
                return Err("--sockname-file needs a file name".into());
            }
            "--sockname-file" => self.sockname_file = Some(PathBuf::from(v)),
            "--opensm-args" => {
                self.opensm_args = Some(
                    v.split(|c: char| c == ',' || c.is_whitespace())
                        .filter(|w| !w.is_empty())
                        .map(String::from)
                        .collect(),
                )
            }
            _ => return self.faults.parse_arg(flag, v),
        }
        Ok(true)
    }

    fn choose_sm(&mut self, c: SmChoice) -> Result<(), String> {
        if self.sm_given && self.sm != c {
            return Err(format!(
                "two subnet managers asked for: --sm {} and --sm {} (--embedded-sm is --sm embedded)",
                self.sm.name(),
                c.name()
            ));
        }
        self.sm = c;
        self.sm_given = true;
        Ok(())
    }

    /// The link layers of the nodes' ports 1 and 2 (`--link-layer`).
    pub fn port_link_layers(&self) -> [LinkLayer; 2] {
        self.link_layers.unwrap_or([LinkLayer::Ib; 2])
    }

    /// The topology these options describe for `nodes` emulated nodes
    /// (the file's HCA count must equal `nodes`).
    pub fn topology(&self, nodes: usize) -> Result<Topology, String> {
        let ll = self.port_link_layers();
        let t = match &self.topology {
            TopologyChoice::Switch => Topology::for_nodes_with(nodes, ll).map_err(|e| e.0)?,
            TopologyChoice::BackToBack => {
                if nodes != 2 {
                    return Err(format!("--back-to-back needs exactly 2 nodes, not {nodes}"));
                }
                Topology::back_to_back_with(ll[0])
            }
            TopologyChoice::File(p) if ll.contains(&LinkLayer::Eth) => {
                return Err(format!(
                    "--topology {}: net files describe InfiniBand fabrics; --link-layer eth \
                     takes the default switch or --back-to-back",
                    p.display()
                ));
            }
            TopologyChoice::File(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("--topology {}: {e}", p.display()))?;
                let t = Topology::from_netfile(&text)
                    .map_err(|e| format!("--topology {}: {e}", p.display()))?;
                let n = t.hcas().count();
                if n != nodes {
                    return Err(format!(
                        "--topology {}: the file has {n} HCAs but {nodes} nodes were asked for",
                        p.display()
                    ));
                }
                t
            }
        };
        Ok(t)
    }

    /// Builds the topology onto `fabric`, starts the capture, and installs
    /// the faults and cable pulls (times counted from fabric time 0).
    pub fn build(&self, fabric: &mut Fabric, nodes: usize) -> Result<Built, String> {
        let built = self.topology(nodes)?.build(fabric).map_err(|e| e.0)?;
        if let Some(l) = self.latency_ns {
            fabric.latency_ns = l;
        }
        if let Some(s) = self.faults.seed {
            fabric.faults.seed(s);
        }
        for spec in &self.faults.rules {
            let mut r = spec.rule.clone();
            if let Some(p) = &spec.port {
                r.matcher.port = Some(built.resolve(fabric, p)?);
            }
            fabric.faults.add(r);
        }
        for pull in &self.faults.pulls {
            let p = built.resolve(fabric, &pull.port)?;
            if fabric.peer(p).is_none() {
                return Err(format!(
                    "--pull {}/{}: that port has no cable",
                    pull.port.node, pull.port.port
                ));
            }
            match pull.at {
                PullAt::Time(at_ns) => {
                    let back = pull.reinsert_after_ns.map(|d| at_ns.saturating_add(d));
                    fabric.schedule_unplug(p, at_ns, back)
                }
                PullAt::Bytes(n) => fabric.unplug_after_bytes(p, n, pull.reinsert_after_ns),
            }
            .map_err(|e| e.to_string())?;
        }
        if self.sm == SmChoice::Embedded && ib_cabled(fabric, &built) {
            fabric
                .add_sm_on_free_port(embedded_sm_config())
                .map_err(|_| {
                    "--sm embedded: no switch port without a cable for the SM".to_string()
                })?;
            // LIDs by the plan (the SM host of `start_sm` included), not
            // by which guest's driver answers first.
            let sm_port = fabric.sm().map(|s| s.port_guid()).unwrap_or_default();
            let plan = lid_plan(fabric, &built, sm_port, &[SM_HOST_END]);
            if let Some(sm) = fabric.sm_mut() {
                *sm = sm.restarted().with_lid_map(plan.into_iter().collect());
            }
        }
        if let Some(path) = &self.capture {
            let c =
                Capture::create(path).map_err(|e| format!("--capture {}: {e}", path.display()))?;
            fabric.set_capture(Some(c));
        }
        Ok(built)
    }

    /// Starts the ibsim server on `fabric` (built by [`Self::build`]) with
    /// the SM host `smhost` on the first switch's last free port, records
    /// the socket name (`--sockname-file`), and for `--sm opensm` starts
    /// OpenSM as a child process (its log `DIR/opensm.log`, DIR from
    /// `--sm-dir`, else `cx3-emu-<pid>` under the temporary directory).
    /// `base` is the socket name, unique per emulator (`lego-<pid>-<n>`). `None`
    /// when nothing is to run: `--sm none` without a free switch port.
    pub fn start_sm(
        &self,
        fabric: &mut Fabric,
        built: &Built,
        base: &str,
    ) -> Result<Option<SmService>, String> {
        if !ib_cabled(fabric, built) {
            // An all-Ethernet fabric: nothing for an SM or the diags.
            return Ok(None);
        }
        let switch = built.switches.first().map(|s| s.1);
        let free = switch.is_some_and(|sw| {
            fabric.switch(sw).is_some_and(|s| {
                (1..=s.nports())
                    .filter_map(|p| fabric.switch_port(sw, p))
                    .any(|fp| fabric.peer(fp).is_none())
            })
        });
        if !free {
            return match self.sm {
                SmChoice::None => Ok(None),
                SmChoice::OpenSm => Err(
                    "--sm opensm needs a switch with a free port for OpenSM's host node \
                     (not --back-to-back); try --sm none"
                        .into(),
                ),
                // `build` has refused it already.
                SmChoice::Embedded => Ok(None),
            };
        }
        let dir = self.sm_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("cx3-emu-{}", std::process::id()))
        });
        let opts = SmOptions {
            base: base.to_string(),
            switch,
            peer: None,
            opensm: self.sm == SmChoice::OpenSm,
            opensm_args: self
                .opensm_args
                .clone()
                .unwrap_or_else(|| DEFAULT_OPENSM_ARGS.iter().map(|s| s.to_string()).collect()),
            dir,
            sockname_file: self.sockname_file.clone(),
            timeout: SM_REQUEST_TIMEOUT,
        };
        if opts.opensm {
            let plan = lid_plan(fabric, built, SM_HOST_END.2, &[]);
            seed_guid2lid(&opts.dir, &plan)?;
        }
        if opts.opensm && !opensm_installed() {
            return Err(
                "--sm opensm: OpenSM or the umad2sim preload is not installed \
                 (Debian packages opensm and libumad2sim0: scripts/deps.sh ensure_ib_peers); \
                 --sm embedded runs the fabric's own SM instead"
                    .into(),
            );
        }
        SmService::start(fabric, &opts, Vec::new()).map(Some)
    }
}

/// The LIDs the subnet manager is to give, so that they never depend on
/// which port a sweep reaches first (a guest whose driver comes up late):
/// the SM's own port (`sm_port`) LID 1, then every end port (switch port 0,
/// each cabled HCA port, and `extra` ports such as the SM host of the
/// ibsim server) by node GUID and port number, as the embedded SM orders
/// the ports of one sweep ([`super::sm`]). With `--nodes N` that is: the
/// switch 2, node i LID 3 + i, under either SM. `(port GUID, LID)` pairs.
pub fn lid_plan(
    fabric: &Fabric,
    built: &Built,
    sm_port: u64,
    extra: &[(u64, u8, u64)],
) -> Vec<(u64, u16)> {
    // (node GUID, port, port GUID)
    let mut ends: Vec<(u64, u8, u64)> = extra.to_vec();
    for (_, sw) in &built.switches {
        if let Some(s) = fabric.switch(*sw) {
            ends.push((s.node_guid, 0, s.node_guid));
        }
    }
    for h in &built.hcas {
        for (i, p) in h.ports.iter().enumerate() {
            if fabric.cable_link_layer(*p) == Some(LinkLayer::Ib) {
                let n = i as u8 + 1;
                ends.push((h.node_guid, n, h.node_guid + u64::from(n)));
            }
        }
    }
    ends.sort_unstable();
    let mut plan = vec![(sm_port, 1u16)];
    for (_, _, guid) in ends {
        let lid = plan.len() + 1;
        if lid >= 0xc000 {
            break;
        }
        if guid != sm_port {
            plan.push((guid, lid as u16));
        }
    }
    plan
}

/// `ib`, `eth` (both ports), or `P1,P2`.
pub fn parse_link_layers(v: &str) -> Option<[LinkLayer; 2]> {
    let mut it = v.split(',');
    let a = LinkLayer::parse(it.next()?)?;
    let b = match it.next() {
        Some(b) => LinkLayer::parse(b)?,
        None => a,
    };
    it.next().is_none().then_some([a, b])
}

/// Some HCA port of `built` has an InfiniBand cable (a subnet to manage).
fn ib_cabled(fabric: &Fabric, built: &Built) -> bool {
    built.hcas.iter().any(|h| {
        h.ports
            .iter()
            .any(|p| fabric.cable_link_layer(*p) == Some(LinkLayer::Ib))
    })
}

/// Writes [`lid_plan`] into OpenSM's guid2lid cache in `dir`, in the
/// format OpenSM writes it, unless a cache is there already (a restart in
/// the same directory keeps what OpenSM knew).
fn seed_guid2lid(dir: &std::path::Path, plan: &[(u64, u16)]) -> Result<(), String> {
    let file = dir.join("guid2lid");
    if file.exists() {
        return Ok(());
    }
    let mut text = String::new();
    for (guid, lid) in plan {
        text.push_str(&format!("0x{guid:016x} 0x{lid:04x} 0x{lid:04x}\n\n"));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))
}

/// The SM host of the ibsim server, as an end port for [`lid_plan`].
const SM_HOST_END: (u64, u8, u64) = (
    super::ibsim::SM_HOST_GUID,
    1,
    super::ibsim::SM_HOST_GUID + 1,
);

/// Whether OpenSM and the umad2sim preload it runs under are installed.
pub fn opensm_installed() -> bool {
    let opensm = std::path::Path::new("/usr/sbin/opensm").exists()
        || std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("opensm").is_file()));
    opensm && std::path::Path::new(super::ibsim::UMAD2SIM).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_build() {
        let mut o = FabricOptions::default();
        assert_eq!(o.parse_arg("--back-to-back", None), Ok(true));
        assert_eq!(o.parse_arg("--latency", Some("2us")), Ok(true));
        assert_eq!(
            o.parse_arg("--drop", Some("every=5,port=node1/1")),
            Ok(true)
        );
        assert_eq!(o.parse_arg("--pull", Some("node0/1@1ms+2ms")), Ok(true));
        assert_eq!(o.parse_arg("--nodes", Some("2")), Ok(false));
        assert!(o.parse_arg("--capture", None).is_err());
        let mut f = Fabric::new();
        assert!(o.build(&mut f, 3).unwrap_err().contains("exactly 2"));
        let mut f = Fabric::new();
        let b = o.build(&mut f, 2).unwrap();
        assert_eq!(f.latency_ns, 2000);
        assert_eq!(f.faults.rules[0].matcher.port, b.hca_port(1, 1));
        assert_eq!(f.next_due(), Some(1_000_000), "the pull is scheduled");
        let mut o = FabricOptions::default();
        o.parse_arg("--pull", Some("node0/2@1ms")).unwrap();
        assert!(
            o.build(&mut Fabric::new(), 2)
                .unwrap_err()
                .contains("no cable")
        );
        let mut o = FabricOptions::default();
        assert_eq!(o.parse_arg("--embedded-sm", None), Ok(true));
        assert_eq!(o.sm, SmChoice::Embedded);
        let mut f = Fabric::new();
        o.build(&mut f, 2).unwrap();
        let p = f.sm().unwrap().port();
        assert_eq!(f.port_name(f.peer(p).unwrap()), "sw0/3");
        o.topology = TopologyChoice::BackToBack;
        assert!(
            o.build(&mut Fabric::new(), 2)
                .unwrap_err()
                .contains("--sm embedded")
        );
        let mut o = FabricOptions::default();
        o.parse_arg("--topology", Some("/nonexistent/net")).unwrap();
        assert!(
            o.build(&mut Fabric::new(), 2)
                .unwrap_err()
                .contains("/nonexistent/net")
        );
    }

    #[test]
    fn sm_choice() {
        let mut o = FabricOptions::default();
        assert_eq!(o.sm, SmChoice::None, "no SM unless asked");
        assert_eq!(o.parse_arg("--sm", Some("opensm")), Ok(true));
        assert_eq!(
            o.parse_arg("--sm", Some("opensm")),
            Ok(true),
            "repeating is fine"
        );
        let e = o.parse_arg("--embedded-sm", None).unwrap_err();
        assert!(e.contains("two subnet managers"), "{e}");
        assert!(o.parse_arg("--sm", None).is_err());
        let e = o.parse_arg("--sm", Some("osm")).unwrap_err();
        assert!(e.contains("opensm, embedded or none"), "{e}");
        assert_eq!(o.parse_arg("--opensm-args", Some("-s,0 -d1")), Ok(true));
        assert_eq!(
            o.opensm_args,
            Some(vec!["-s".to_string(), "0".to_string(), "-d1".to_string()])
        );
        assert!(o.parse_arg("--sm-dir", Some("")).is_err());
        assert_eq!(o.parse_arg("--sm-dir", Some("/tmp/x")), Ok(true));
        assert_eq!(o.sm_dir, Some(PathBuf::from("/tmp/x")));
        let mut o = FabricOptions::default();
        o.parse_arg("--sm", Some("embedded")).unwrap();
        assert_eq!(
            o.parse_arg("--embedded-sm", None),
            Ok(true),
            "the alias agrees"
        );
        assert_eq!(o.sm, SmChoice::Embedded);
        // Back to back there is no switch port for OpenSM's host node:
        // refused with a word on what to do; `none` runs without a server.
        let mut o = FabricOptions::default();
        o.parse_arg("--back-to-back", None).unwrap();
        o.parse_arg("--sm", Some("opensm")).unwrap();
        let mut f = Fabric::new();
        let b = o.build(&mut f, 2).unwrap();
        let e = o.start_sm(&mut f, &b, "lego-unit-b2b").unwrap_err();
        assert!(e.contains("--sm none"), "{e}");
        o.sm = SmChoice::None;
        assert!(o.start_sm(&mut f, &b, "lego-unit-b2b").unwrap().is_none());
    }

    #[test]
    fn both_sms_are_told_the_same_lids() {
        let dir = std::env::temp_dir().join(format!("lego-g2l-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut f = Fabric::new();
        let b = FabricOptions::default().build(&mut f, 2).unwrap();
        let sw = f.switch(b.switches[0].1).unwrap().node_guid;
        let (n0, n1) = (b.hcas[0].node_guid + 1, b.hcas[1].node_guid + 1);
        let plan = lid_plan(&f, &b, SM_HOST_END.2, &[]);
        assert_eq!(
            plan,
            [(SM_HOST_END.2, 1), (sw, 2), (n0, 3), (n1, 4)],
            "OpenSM: its host node 1, the switch 2, node i 3 + i"
        );
        seed_guid2lid(&dir, &plan).unwrap();
        let text = std::fs::read_to_string(dir.join("guid2lid")).unwrap();
        assert_eq!(
            text,
            format!(
                "0x{:016x} 0x0001 0x0001\n\n0x{sw:016x} 0x0002 0x0002\n\n\
                 0x{n0:016x} 0x0003 0x0003\n\n0x{n1:016x} 0x0004 0x0004\n\n",
                SM_HOST_END.2
            )
        );
        // A cache already there (a restart in the same directory) stays.
        std::fs::write(dir.join("guid2lid"), "kept").unwrap();
        seed_guid2lid(&dir, &plan).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("guid2lid")).unwrap(),
            "kept"
        );
        let _ = std::fs::remove_dir_all(&dir);
        // The embedded SM: itself 1, then the same order, the SM host of
        // the ibsim server last (its GUID is the highest).
        let mut o = FabricOptions::default();
        o.parse_arg("--sm", Some("embedded")).unwrap();
        let mut f = Fabric::new();
        o.build(&mut f, 2).unwrap();
        let sm = f.sm().unwrap();
        assert_eq!(sm.lid_of(sm.port_guid()), Some(1));
        assert_eq!(sm.lid_of(sw), Some(2));
        assert_eq!((sm.lid_of(n0), sm.lid_of(n1)), (Some(3), Some(4)));
        assert_eq!(sm.lid_of(SM_HOST_END.2), Some(5));
    }

    #[test]
    fn sm_none_still_serves_the_diags() {
        let dir = std::env::temp_dir().join(format!("lego-opts-{}", std::process::id()));
        let mut o = FabricOptions::default();
        o.parse_arg("--sm", Some("none")).unwrap();
        o.sm_dir = Some(dir.join("opensm"));
        o.sockname_file = Some(dir.join("sockname"));
        let mut f = Fabric::new();
        let b = o.build(&mut f, 2).unwrap();
        let base = format!("lego-opts-{}", std::process::id());
        let mut svc = o.start_sm(&mut f, &b, &base).unwrap().expect("a server");
        assert!(svc.opensm_pid().is_none(), "no OpenSM with --sm none");
        let smhost = svc.server.node("smhost").expect("the SM host").port;
        let sw = f.peer(smhost).expect("cabled");
        assert_eq!(f.port_name(sw), "sw0/36", "the switch's last port");
        assert_eq!(
            std::fs::read_to_string(dir.join("sockname"))
                .unwrap()
                .trim(),
            base
        );
        svc.stop(&mut f, 0);
        assert!(!dir.join("sockname").exists(), "removed on stop");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
