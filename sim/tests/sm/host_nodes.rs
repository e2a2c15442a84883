//! The embedded SM against the fabric's host nodes
//! (`sim::fabric::HostNode`): CAs whose SMA another engineer wrote from the
//! IBTA and ibsim, so the SM is checked by an SMA that is not the test's
//! own.

use sim::fabric::LogicalState;
use sim::fabric::host_node::{Handled, Mad};
use sim::fabric::packet::{MAD_LEN, MadHdr, method};
use sim::fabric::{Fabric, HostNode, SmConfig, Topology};

const SEC: u64 = 1_000_000_000;

struct Rig {
    f: Fabric,
    nodes: Vec<HostNode>,
    inbox: Vec<Vec<Mad>>,
    now: u64,
}

impl Rig {
    fn new(n: usize) -> Rig {
        let mut f = Fabric::new();
        let built = Topology::for_nodes(n).unwrap().build(&mut f).unwrap();
        let nodes: Vec<HostNode> = built
            .hcas
            .iter()
            .enumerate()
            .map(|(i, h)| HostNode::new(&mut f, &format!("H{i}"), h.node_guid, h.ports[0]))
            .collect();
        f.add_sm_on_free_port(SmConfig::default()).unwrap();
        Rig {
            f,
            inbox: vec![Vec::new(); nodes.len()],
            nodes,
            now: 0,
        }
    }

    /// Steps of 1 µs until `cond` or `limit`; host nodes answer their SMA
    /// and PMA MADs and keep the rest.
    fn run_until(&mut self, limit: u64, mut cond: impl FnMut(&Rig) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            self.f.advance(self.now);
            for (i, n) in self.nodes.iter_mut().enumerate() {
                while let Some(r) = n.receive(&mut self.f, self.now) {
                    let Ok(m) = r else { continue };
                    match n.handle(&m) {
                        Handled::Reply(r) => {
                            let _ = n.transmit(&mut self.f, self.now, &r);
                        }
                        Handled::Up(m) => self.inbox[i].push(m),
                        Handled::Drop(_) => {}
                    }
                }
            }
            if cond(self) {
                return true;
            }
            self.now += 1_000;
            // Nothing due before then: jump to the next thing due.
            if let Some(t) = self.f.next_due()
                && t > self.now
            {
                self.now = t.min(end);
            }
        }
        cond(self)
    }
}

#[test]
fn host_nodes_come_up_active_under_the_embedded_sm_and_query_its_sa() {
    let mut r = Rig::new(3);
    assert!(r.run_until(5 * SEC, |r| r.f.sm().unwrap().is_master()
        && !r.f.sm().unwrap().sweeping()));
    let sm = r.f.sm().unwrap();
    let sm_lid = sm.lid();
    println!(
        "embedded SM over host nodes (1 switch + 3 CAs): {} SMPs, log:\n  {}",
        sm.stats().smps_last_heavy,
        sm.log().join("\n  ")
    );
    let mut lids: Vec<u16> = r.nodes.iter().map(|n| n.lid()).collect();
    assert!(
        r.nodes
            .iter()
            .all(|n| n.state() == LogicalState::Active && n.sm_lid() == sm_lid)
    );
    lids.sort();
    lids.dedup();
    assert_eq!(lids.len(), 3);
    assert!(!lids.contains(&0) && !lids.contains(&sm_lid));
    // H0 asks the SA for a path to H2.
    let mut m = Mad {
        dlid: sm_lid,
        slid: 0,
        dqp: 1,
        sqp: 1,
        sl: 0,
        pkey: 0xffff,
        len: MAD_LEN,
        data: [0; MAD_LEN],
    };
    MadHdr {
        base_version: 1,
        mgmt_class: 0x03,
        class_version: 2,
        method: method::GET,
        tid: 0x77,
        attr_id: 0x35,
        ..MadHdr::default()
    }
    .write(&mut m.data);
    m.data[48..56].copy_from_slice(&(1u64 << 4 | 1 << 5).to_be_bytes());
    let dlid = r.nodes[2].lid();
    m.data[56 + 40..56 + 42].copy_from_slice(&dlid.to_be_bytes());
    let slid = r.nodes[0].lid();
    m.data[56 + 42..56 + 44].copy_from_slice(&slid.to_be_bytes());
    let now = r.now;
    r.nodes[0].transmit(&mut r.f, now, &m).unwrap();
    assert!(r.run_until(SEC, |r| !r.inbox[0].is_empty()));
    let a = &r.inbox[0][0];
    assert_eq!((a.slid, a.sqp), (sm_lid, 1));
    assert_eq!(a.hdr().status, 0);
    assert_eq!(
        &a.data[56 + 40..56 + 44],
        &[dlid.to_be_bytes(), r.nodes[0].lid().to_be_bytes()].concat()
    );
    // The host nodes' P_Key tables were left as they were (this SM does
    // not program partitions).
    assert_eq!(r.nodes[1].pkeys()[0], 0xffff);
}
