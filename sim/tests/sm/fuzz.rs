//! Bad input at the SM's port: mutated SA requests, SMPs and RMPP control
//! MADs (CRCs resealed so they reach the SM) never panic it, and it keeps
//! answering and sweeping.

use sim::fabric::Packet;
use sim::fabric::packet::{self, MAD_LEN, MadHdr, PERMISSIVE_LID, Smp, attr, method};

use crate::net::Net;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn mutated_mads_to_the_sm_never_panic_it() {
    let mut net = Net::star(2);
    assert!(net.run_until(5_000_000_000, |n| n.sm_master()));
    let sm_lid = net.f.sm().unwrap().lid();
    let me = net.cas[0].lid;
    let mut rng = Lcg(0x5eed);
    let n: usize = std::env::var("SM_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    for i in 0..n {
        let mut mad = [0u8; MAD_LEN];
        let kind = rng.next() % 3;
        let (dlid, qp) = match kind {
            0 => {
                // An SA request with random fields.
                MadHdr {
                    base_version: 1,
                    mgmt_class: 0x03,
                    class_version: 2,
                    method: [method::GET, 0x12, method::SET, 0x15][(rng.next() % 4) as usize],
                    tid: i as u64,
                    attr_id: [0x35, 0x11, 0x12, 0x01, 0x20][(rng.next() % 5) as usize],
                    ..MadHdr::default()
                }
                .write(&mut mad);
                (sm_lid, 1)
            }
            1 => {
                // A directed-route SMP to the SM node.
                let mut s = Smp::dr_get(i as u64, attr::SM_INFO, 0, &[1, 3]).unwrap();
                s.hop_ptr = 1;
                mad = s.to_bytes();
                (PERMISSIVE_LID, 0)
            }
            _ => {
                // An RMPP control MAD.
                MadHdr {
                    base_version: 1,
                    mgmt_class: 0x03,
                    class_version: 2,
                    method: 0x12,
                    tid: rng.next() % 4,
                    attr_id: 0x11,
                    ..MadHdr::default()
                }
                .write(&mut mad);
                mad[24] = 1;
                mad[25] = (rng.next() % 5) as u8;
                mad[26] = 1;
                (sm_lid, 1)
            }
        };
        for _ in 0..(rng.next() % 8) {
            let o = (rng.next() % MAD_LEN as u64) as usize;
            mad[o] = rng.next() as u8;
        }
        let len = if rng.next().is_multiple_of(10) {
            (rng.next() % MAD_LEN as u64) as usize
        } else {
            MAD_LEN
        };
        let h = packet::mad_headers(
            dlid,
            if qp == 0 { PERMISSIVE_LID } else { me },
            qp,
            qp,
            0xffff,
        );
        let Ok(bytes) = packet::build(&h, &mad[..len]) else {
            continue;
        };
        let p = net.cas[0].port;
        net.f.transmit(p, Packet { bytes }, net.now);
        net.run_for(2_000);
        net.take_mads(0);
    }
    // Directed-route SMPs whose hop pointer and count agree but are out of
    // range (C14-6: at most 63 hops) are dropped, not followed.
    for cnt in [63u8, 64, 200, 255] {
        let mut s = Smp::dr_get(7, attr::NODE_INFO, 0, &[1, 3]).unwrap();
        let mut m = s.to_bytes();
        m[6] = cnt;
        m[7] = cnt;
        s = Smp::parse(&m).unwrap();
        let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
        let bytes = packet::build(&h, &s.to_bytes()).unwrap();
        let sm_port = net.f.sm().unwrap().port();
        // Straight onto the SM's cable (from the switch's side).
        let sw_port = net.f.peer(sm_port).unwrap();
        net.f.transmit(sw_port, Packet { bytes }, net.now);
        net.run_for(2_000);
    }
    // Still the SM and SA it was: a PathRecord Get is answered.
    let mut m = [0u8; MAD_LEN];
    MadHdr {
        base_version: 1,
        mgmt_class: 0x03,
        class_version: 2,
        method: method::GET,
        tid: 0xfeed,
        attr_id: 0x35,
        ..MadHdr::default()
    }
    .write(&mut m);
    m[48..56].copy_from_slice(&(1u64 << 4 | 1 << 5).to_be_bytes());
    let b = net.cas[1].lid;
    m[56 + 40..56 + 42].copy_from_slice(&b.to_be_bytes());
    let a = net.cas[0].lid;
    m[56 + 42..56 + 44].copy_from_slice(&a.to_be_bytes());
    net.run_for(20_000_000_000);
    assert!(net.send_gmp(0, sm_lid, &m));
    net.run_for(10_000);
    let got = net.take_mads(0);
    let ok = got.iter().any(|(_, r)| {
        let h = MadHdr::parse(r).unwrap();
        h.tid == 0xfeed && h.status == 0
    });
    assert!(ok, "the SA still answers");
    assert!(net.cas.iter().all(|c| c.state == 4));
    let st = net.f.sm().unwrap().stats().clone();
    println!("fuzz: {n} MADs, SM stats {st:?}");
    assert!(st.bad_mads > 0 && st.sa_answered > 0);
}
