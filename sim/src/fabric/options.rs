//! The fabric's command-line options for cx3-emu (and `run-qemu.sh
//! --emu-args`): the topology (`--topology FILE` in ibsim's net format,
//! `--back-to-back`; otherwise one switch for the nodes), `--capture
//! FILE` (pcapng, or classic pcap for a `.pcap` name), `--latency TIME`,
//! and the packet faults (`--drop`, `--corrupt`, `--delay`, `--pull`,
//! `--fault-seed`, see [`super::faults::FaultOptions`]), and
//! `--embedded-sm` (the fabric's own SM, [`super::sm`], on the first free
//! switch port: what `run-qemu.sh --sm embedded` asks for). The CLI itself
//! belongs to the front end; this only parses values and builds the
//! fabric from them.
//!
//! Use: for each `--flag value` pair call [`FabricOptions::parse_arg`]
//! (it says whether it took the flag), then [`FabricOptions::build`]
//! with the number of nodes; node i of the emulator is HCA i of the
//! returned [`Built`] (its node GUID and the fabric ports of its ports 1
//! and 2).

use std::path::PathBuf;

use super::faults::{FaultOptions, parse_time};
use super::{Built, Capture, Fabric, Topology};

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
    /// Put the embedded SM on the fabric.
    pub embedded_sm: bool,
}

impl FabricOptions {
    /// Flags that take a value.
    pub const VALUE_FLAGS: [&'static str; 8] = [
        "--topology",
        "--capture",
        "--latency",
        "--drop",
        "--corrupt",
        "--delay",
        "--pull",
        "--fault-seed",
    ];
    /// Flags without a value.
    pub const BARE_FLAGS: [&'static str; 2] = ["--back-to-back", "--embedded-sm"];

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
            self.embedded_sm = true;
            return Ok(true);
        }
        if !Self::VALUE_FLAGS.contains(&flag) {
            return Ok(false);
        }
        let v = value.ok_or_else(|| format!("{flag} needs a value"))?;
        match flag {
            "--topology" => self.topology = TopologyChoice::File(PathBuf::from(v)),
            "--capture" => self.capture = Some(PathBuf::from(v)),
            "--latency" => {
                self.latency_ns = Some(parse_time(v).map_err(|e| format!("--latency {v}: {e}"))?)
            }
            _ => return self.faults.parse_arg(flag, v),
        }
        Ok(true)
    }

    /// The topology these options describe for `nodes` emulated nodes
    /// (the file's HCA count must equal `nodes`).
    pub fn topology(&self, nodes: usize) -> Result<Topology, String> {
        let t = match &self.topology {
            TopologyChoice::Switch => Topology::for_nodes(nodes).map_err(|e| e.0)?,
            TopologyChoice::BackToBack => {
                if nodes != 2 {
                    return Err(format!("--back-to-back needs exactly 2 nodes, not {nodes}"));
                }
                Topology::back_to_back()
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
            let back = pull.reinsert_after_ns.map(|d| pull.at_ns.saturating_add(d));
            fabric
                .schedule_unplug(p, pull.at_ns, back)
                .map_err(|e| e.to_string())?;
        }
        if self.embedded_sm {
            fabric
                .add_sm_on_free_port(super::SmConfig::default())
                .map_err(|_| {
                    "--embedded-sm: no switch port without a cable for the SM".to_string()
                })?;
        }
        if let Some(path) = &self.capture {
            let c =
                Capture::create(path).map_err(|e| format!("--capture {}: {e}", path.display()))?;
            fabric.set_capture(Some(c));
        }
        Ok(built)
    }
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
        let mut f = Fabric::new();
        o.build(&mut f, 2).unwrap();
        let p = f.sm().unwrap().port();
        assert_eq!(f.port_name(f.peer(p).unwrap()), "sw0/3");
        o.topology = TopologyChoice::BackToBack;
        assert!(
            o.build(&mut Fabric::new(), 2)
                .unwrap_err()
                .contains("--embedded-sm")
        );
        let mut o = FabricOptions::default();
        o.parse_arg("--topology", Some("/nonexistent/net")).unwrap();
        assert!(
            o.build(&mut Fabric::new(), 2)
                .unwrap_err()
                .contains("/nonexistent/net")
        );
    }
}
