//! A star: one switch, `n` test CAs on ports 1..=n, the SM on port n+1.

use sim::fabric::packet::{self, MadHdr};
use sim::fabric::{Capture, Fabric, Packet, PortId, SmConfig, SwitchId, Topology};

use crate::ca::Ca;

pub struct Net {
    pub f: Fabric,
    pub cas: Vec<Ca>,
    pub sw: SwitchId,
    pub switches: Vec<SwitchId>,
    pub now: u64,
    /// Ports of dead nodes whose packets are thrown away.
    pub sinks: Vec<PortId>,
}

pub const SM_GUID: u64 = 0x0002_c903_00ff_0000;

impl Net {
    pub fn star(n: usize) -> Net {
        Net::build(&Topology::for_nodes(n).unwrap())
    }

    /// The HCAs of `t` as test CAs (port 1), the SM on the first free
    /// switch port.
    pub fn build(t: &Topology) -> Net {
        Net::build_with(t, SmConfig::default())
    }

    /// [`Net::build`] with the SM configured as `cfg` (its node GUID
    /// always [`SM_GUID`]).
    pub fn build_with(t: &Topology, cfg: SmConfig) -> Net {
        Net::build_prepared(t, cfg, |_| {})
    }

    /// [`Net::build_with`], the CAs prepared by `prep` first.
    pub fn build_prepared(t: &Topology, cfg: SmConfig, prep: impl FnOnce(&mut [Ca])) -> Net {
        let mut f = Fabric::new();
        let built = t.build(&mut f).unwrap();
        let sw = built.switches[0].1;
        let switches = built.switches.iter().map(|(_, s)| *s).collect();
        let mut cas = Vec::new();
        for (i, h) in built.hcas.iter().enumerate() {
            f.set_enabled(h.ports[0], true).unwrap();
            cas.push(Ca::new(h.ports[0], h.node_guid, &format!("node{i} HCA-1")));
        }
        let cap = std::env::temp_dir().join(format!(
            "legoib-sm-{}-{:?}.pcapng",
            std::process::id(),
            std::thread::current().id()
        ));
        f.set_capture(Some(Capture::create(&cap).unwrap()));
        let _ = std::fs::remove_file(&cap);
        prep(&mut cas);
        let cfg = SmConfig {
            node_guid: SM_GUID,
            ..cfg
        };
        f.add_sm_on_free_port(cfg).unwrap();
        Net {
            f,
            cas,
            sw,
            switches,
            now: 0,
            sinks: Vec::new(),
        }
    }

    /// One step: the fabric (and the SM) and every CA.
    fn step(&mut self) -> bool {
        self.f.advance(self.now);
        let mut did = false;
        for &p in &self.sinks {
            while self.f.receive(p, self.now).is_some() {}
        }
        for c in &mut self.cas {
            did |= c.poll(&mut self.f, self.now);
        }
        self.f.advance(self.now);
        did || self.f.next_due().is_some_and(|t| t <= self.now)
    }

    /// Runs until `cond` holds or `limit_ns` of model time pass; steps of
    /// 1 µs while there is work, else a jump to the next thing due.
    pub fn run_until(&mut self, limit_ns: u64, mut cond: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + limit_ns;
        for _ in 0..2_000_000 {
            if cond(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            let busy = self.step();
            if cond(self) {
                // `now` stays the time it became true.
                return true;
            }
            self.now = if busy {
                self.now + 1_000
            } else {
                self.f
                    .next_due()
                    .unwrap_or(end)
                    .clamp(self.now + 1_000, end)
            };
        }
        false
    }

    /// Runs for `ns` of model time.
    pub fn run_for(&mut self, ns: u64) {
        self.run_until(ns, |_| false);
    }

    pub fn built_switch(&self, j: usize) -> SwitchId {
        self.switches[j]
    }

    pub fn sm_master(&self) -> bool {
        self.f.sm().is_some_and(|s| s.is_master() && !s.sweeping())
    }

    /// Sends a GMP (QP1 to QP1) from CA `i` to `dlid`.
    pub fn send_gmp(&mut self, i: usize, dlid: u16, mad: &[u8; 256]) -> bool {
        let h = packet::mad_headers(dlid, self.cas[i].lid, 1, 1, 0xffff);
        let bytes = packet::build(&h, mad).unwrap();
        let p = self.cas[i].port;
        self.f.transmit(p, Packet { bytes }, self.now)
    }

    /// The MADs CA `i` got (not SMPs to its SMA), emptying its inbox.
    pub fn take_mads(&mut self, i: usize) -> Vec<(packet::Parsed, Vec<u8>)> {
        std::mem::take(&mut self.cas[i].inbox)
            .into_iter()
            .filter_map(|p| {
                let x = packet::parse_checked(&p.bytes).ok()?;
                let m = x.payload(&p.bytes).to_vec();
                MadHdr::parse(&m).ok()?;
                Some((x, m))
            })
            .collect()
    }
}
