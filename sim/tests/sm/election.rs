//! The embedded SM among other SMs: SMInfo, standing by, polling, handover.
//!
//! The other SM is a test CA that answers SMInfo (IsSM set) with a priority and
//! state the test chooses, records the SubnSet(SMInfo) it is sent, and can fall
//! silent; everything on the fake model clock.

use sim::fabric::SmConfig;
use sim::fabric::packet::{self, PERMISSIVE_LID, Smp, attr, method};
use sim::fabric::sm::sm_state;
use sim::fabric::{Packet, Topology};

use crate::ca::FakeSm;
use crate::net::{Net, SM_GUID};

const SEC: u64 = 1_000_000_000;

fn cfg(priority: u8) -> SmConfig {
    SmConfig {
        priority,
        polling_interval_ns: SEC,
        ..SmConfig::default()
    }
}

fn fake(priority: u8, state: u8) -> Option<FakeSm> {
    Some(FakeSm {
        priority,
        state,
        key: 1,
        ..FakeSm::default()
    })
}

fn state(net: &Net) -> u8 {
    net.f.sm().unwrap().sm_state()
}

fn log(net: &Net) -> String {
    net.f.sm().unwrap().log().join("\n")
}

/// A master of higher priority is found at the first sweep: the embedded
/// SM stands by, configures nothing, polls the master every second, and
/// takes the subnet when `polling_retries` polls go unanswered.
#[test]
fn a_higher_master_makes_it_stand_by_and_its_silence_makes_it_take_over() {
    let mut net = Net::build_prepared(&Topology::for_nodes(2).unwrap(), cfg(5), |cas| {
        cas[1].sm = fake(10, sm_state::MASTER);
    });
    assert!(
        net.run_until(5 * SEC, |n| state(n) == sm_state::STANDBY),
        "{}",
        log(&net)
    );
    let sm = net.f.sm().unwrap();
    assert!(!sm.is_master());
    assert_eq!(sm.master_guid(), net.cas[1].port_guid());
    assert_eq!(
        sm.remote_sms(),
        vec![(net.cas[1].port_guid(), 0, 10, sm_state::MASTER)]
    );
    assert!(
        net.cas.iter().all(|c| c.lid == 0 && c.state == 2),
        "a standby SM configures nothing"
    );
    let gets = net.cas[1].sm.as_ref().unwrap().gets;
    net.run_for(5 * SEC);
    let polls = net.cas[1].sm.as_ref().unwrap().gets - gets;
    assert!((4..=6).contains(&polls), "a poll a second: {polls}");
    assert_eq!(
        state(&net),
        sm_state::STANDBY,
        "an answering master is kept"
    );
    // The master dies.
    net.cas[1].sm.as_mut().unwrap().silent = true;
    let t0 = net.now;
    assert!(net.run_until(30 * SEC, |n| n.sm_master()), "{}", log(&net));
    let took = (net.now - t0) / SEC;
    assert!(
        (4..=8).contains(&took),
        "4 polls unanswered (plus the resends of the last): {took} s\n{}",
        log(&net)
    );
    assert!(log(&net).contains("did not answer"), "{}", log(&net));
    assert!(net.cas.iter().all(|c| c.state == 4 && c.lid != 0));
}

/// The embedded SM is master; a higher SM appears on a CA (IsSM, trap
/// 144): the heavy sweep the trap starts finds it standing by, and the
/// embedded SM hands over (SubnSet(SMInfo) HANDOVER) and stands by; the SA
/// falls silent. When the new master dies, it takes the subnet back with
/// every LID kept.
#[test]
fn a_higher_standby_gets_the_handover_and_the_subnet_comes_back_when_it_dies() {
    let mut net = Net::build_with(&Topology::for_nodes(2).unwrap(), cfg(5));
    assert!(net.run_until(5 * SEC, |n| n.sm_master()), "{}", log(&net));
    let lids: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    net.cas[1].sm = fake(10, sm_state::STANDBY);
    let now = net.now;
    net.cas[1].send_trap144(&mut net.f, now);
    assert!(
        net.run_until(5 * SEC, |n| state(n) == sm_state::STANDBY
            && !n.cas[1].sm.as_ref().unwrap().sets.is_empty()),
        "{}",
        log(&net)
    );
    let fake = net.cas[1].sm.clone().unwrap();
    assert_eq!(fake.sets, vec![1], "one SubnSet(SMInfo) HANDOVER");
    assert_eq!(fake.state, sm_state::MASTER);
    let sm = net.f.sm().unwrap();
    assert_eq!(sm.stats().handovers_sent, 1);
    assert!(sm.stats().traps >= 1);
    assert!(!sm.is_master(), "no SA while standing by");
    // Polled, the new master answers: still standing by.
    net.run_for(5 * SEC);
    assert_eq!(state(&net), sm_state::STANDBY, "{}", log(&net));
    net.cas[1].sm.as_mut().unwrap().silent = true;
    assert!(net.run_until(30 * SEC, |n| n.sm_master()), "{}", log(&net));
    let after: Vec<u16> = net.cas.iter().map(|c| c.lid).collect();
    assert_eq!(lids, after, "LIDs kept across both changes of master");
    assert!(net.cas.iter().all(|c| c.state == 4));
}

/// A lower SM stays standby and is listed; the embedded SM stays master.
#[test]
fn a_lower_standby_is_left_standing_by() {
    let mut net = Net::build_with(&Topology::for_nodes(2).unwrap(), cfg(5));
    assert!(net.run_until(5 * SEC, |n| n.sm_master()));
    net.cas[0].sm = fake(1, sm_state::STANDBY);
    let now = net.now;
    net.cas[0].send_trap144(&mut net.f, now);
    assert!(net.run_until(5 * SEC, |n| !n.f.sm().unwrap().remote_sms().is_empty()));
    net.run_for(12 * SEC);
    let sm = net.f.sm().unwrap();
    assert!(sm.is_master(), "{}", log(&net));
    assert_eq!(sm.stats().handovers_sent, 0);
    let (g, lid, prio, st) = sm.remote_sms()[0];
    assert_eq!(
        (g, lid, prio, st),
        (net.cas[0].port_guid(), net.cas[0].lid, 1, sm_state::STANDBY)
    );
    assert!(net.cas[0].sm.as_ref().unwrap().sets.is_empty());
    assert!(
        net.cas[0].sm.as_ref().unwrap().gets >= 2,
        "found in the heavy sweep, asked again in a light one"
    );
}

/// SMInfo Set to the embedded SM's port as a master would send it.
fn set_sminfo(net: &mut Net, from: usize, amod: u32, remote_state: u8, tid: u64) -> Smp {
    let sm_port_on_switch = 3u8;
    let mut smp = Smp::dr_get(tid, attr::SM_INFO, amod, &[1, sm_port_on_switch]).unwrap();
    smp.hdr.method = method::SET;
    smp.data[0..8].copy_from_slice(&net.cas[from].port_guid().to_be_bytes());
    smp.data[8..16].copy_from_slice(&1u64.to_be_bytes());
    smp.data[20] = 10 << 4 | remote_state;
    smp.hop_ptr = 1;
    let h = packet::mad_headers(PERMISSIVE_LID, PERMISSIVE_LID, 0, 0, 0xffff);
    let bytes = packet::build(&h, &smp.to_bytes()).unwrap();
    let p = net.cas[from].port;
    net.f.transmit(p, Packet { bytes }, net.now);
    net.run_for(10_000);
    std::mem::take(&mut net.cas[from].inbox)
        .into_iter()
        .filter_map(|p| {
            let x = packet::parse_checked(&p.bytes).ok()?;
            Smp::parse(x.payload(&p.bytes)).ok()
        })
        .find(|s| s.hdr.tid == tid)
        .expect("an answer")
}

/// A standby SM takes a HANDOVER only from a master, and becomes master
/// at once (its first sweep as master follows); a HANDOVER from a standby
/// is refused with status 7.
#[test]
fn a_handover_from_the_master_makes_the_standby_master() {
    let mut net = Net::build_prepared(&Topology::for_nodes(2).unwrap(), cfg(5), |cas| {
        cas[1].sm = fake(10, sm_state::MASTER);
    });
    assert!(net.run_until(5 * SEC, |n| state(n) == sm_state::STANDBY));
    let r = set_sminfo(&mut net, 1, 1, sm_state::STANDBY, 0x51);
    assert_eq!(r.hdr.status & 0x7fff, 7, "HANDOVER from a standby: refused");
    assert_eq!(state(&net), sm_state::STANDBY);
    // The master hands over as it stops (its SMInfo says NOT ACTIVE from
    // then on).
    net.cas[1].sm.as_mut().unwrap().state = sm_state::NOT_ACTIVE;
    let r = set_sminfo(&mut net, 1, 1, sm_state::MASTER, 0x52);
    assert_eq!(r.hdr.status & 0x7fff, 0);
    assert_eq!(&r.data[0..8], &(SM_GUID + 1).to_be_bytes());
    assert_eq!(state(&net), sm_state::MASTER);
    assert!(net.run_until(5 * SEC, |n| n.sm_master()), "{}", log(&net));
    assert_eq!(net.f.sm().unwrap().stats().handovers_received, 1);
    assert!(net.cas.iter().all(|c| c.state == 4 && c.lid != 0));
}
