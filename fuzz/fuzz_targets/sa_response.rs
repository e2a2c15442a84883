//! ib_core's SA client: answers to its PathRecord, NodeRecord, PortInfoRecord and MCMemberRecord queries (Get, GetTable, and the Set of a join), in one MAD or in RMPP segments, arriving from the wire through the MAD layer.
//!
//! The query is started with the client's API and goes out on QP1 (the
//! capture gives its TID); the fuzzed answers come back carrying that TID
//! (unless an edit changes it). The records the client hands out are then
//! unpacked, and a path's address vector is built from them
//! (`init_ah_from_path`), as the CM and the tools do; a group's address
//! vector is built from the MCMemberRecords (`init_ah_from_mcmember`), as
//! IPoIB does after a join.

#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use ib_core::mad::{Mad, class};
use ib_core::mad_rmpp::{RmppHdr, rmpp_type};
use ib_core::sa_query::{
    self, McMemberRecord, NodeRecord, PathRecord, PortInfoRecord, path_comp, sa_attr, sa_method,
};
use legoib_fuzz::ibfake::{Arrival, lock};
use legoib_fuzz::ibrig::{self, B_LID};
use legoib_fuzz::madgen::Edit;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Query {
    Path {
        dlid: u16,
        by_gid: bool,
    },
    Node {
        table: bool,
    },
    PortInfo {
        table: bool,
    },
    /// A join of the IPv4 broadcast group (a SubnAdmSet), or every group
    /// (`saquery -g`, a GetTable).
    McMember {
        join: bool,
    },
}

#[derive(Arbitrary, Debug)]
struct Answer {
    /// GetResp (false) or GetTableResp (true), unless an edit says else.
    table: bool,
    status: u16,
    /// In 8-byte words.
    attr_offset: u16,
    /// RMPP header: (type, flags, segment, payload length).
    rmpp: Option<(u8, u8, u8, u16)>,
    /// The SA data (bytes 56..256).
    data: Vec<u8>,
    edits: Vec<Edit>,
    /// Time before it arrives, in microseconds.
    delay_us: u16,
    /// The answer arrives with a GRH.
    grh: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    query: Query,
    answers: Vec<Answer>,
}

/// Raw SA answers from a capture (`fuzz/seeds/from-capture.py`): b"MAD0"
/// then MADs of 256 bytes; the query is the one the first answers
/// (PathRecord, NodeRecord or PortInfoRecord, Get or GetTable).
fn raw_input(mads: &[u8]) -> Input {
    let first = mads.get(..256).unwrap_or(mads);
    let attr = u16::from_be_bytes([*first.get(16).unwrap_or(&0), *first.get(17).unwrap_or(&0)]);
    let table = first.get(3) == Some(&sa_method::GET_TABLE_RESP);
    let query = match attr {
        sa_attr::NODE_REC => Query::Node { table },
        sa_attr::PORT_INFO_REC => Query::PortInfo { table },
        sa_attr::MC_MEMBER_REC => Query::McMember { join: !table },
        _ => Query::Path {
            dlid: B_LID,
            by_gid: false,
        },
    };
    let answers = mads
        .chunks(256)
        .map(|m| {
            let m = Mad::from_bytes(m);
            let rmpp = RmppHdr::read(&m);
            Answer {
                table: m.method() == sa_method::GET_TABLE_RESP,
                status: m.status(),
                attr_offset: sa_query::attr_offset(&m),
                rmpp: rmpp.active().then_some((
                    [
                        rmpp_type::DATA,
                        rmpp_type::ACK,
                        rmpp_type::STOP,
                        rmpp_type::ABORT,
                    ]
                    .iter()
                    .position(|t| *t == rmpp.rtype)
                    .unwrap_or(4) as u8,
                    rmpp.flags,
                    rmpp.seg_num as u8,
                    rmpp.paylen_newwin as u16,
                )),
                data: m.0[56..].to_vec(),
                edits: Vec::new(),
                delay_us: 10,
                grh: false,
            }
        })
        .collect();
    Input { query, answers }
}

fuzz_target!(|data: &[u8]| {
    let input = match data.strip_prefix(b"MAD0") {
        Some(mads) => raw_input(mads),
        None => match Input::arbitrary_take_rest(Unstructured::new(data)) {
            Ok(i) => i,
            Err(_) => return,
        },
    };
    run(input);
});

fn run(input: Input) {
    let mut r = ibrig::rig(true);
    let sa = sa_query::init(&mut r.core);
    r.core.poll();
    let t = Duration::from_millis(100);
    let (core, a) = (&mut r.core, r.a);
    let id = match input.query {
        Query::Path { dlid, by_gid } => {
            let mut rec = PathRecord {
                dlid,
                numb_path: 1,
                ..PathRecord::default()
            };
            rec.sgid = core.device(a).unwrap().get_cached_gid(1, 0).unwrap();
            let mask = if by_gid {
                rec.dgid = ib_core::verbs::Gid::new(0xfe80_0000_0000_0000, ibrig::B_GUID + 1);
                path_comp::DGID | path_comp::SGID
            } else {
                path_comp::DLID | path_comp::SGID
            };
            sa_query::path_rec_get(core, sa, a, 1, &rec, mask, t)
        }
        Query::Node { table: false } => sa_query::node_rec_get(
            core,
            sa,
            a,
            1,
            &NodeRecord {
                lid: B_LID,
                ..NodeRecord::default()
            },
            1,
            t,
        ),
        Query::Node { table: true } => {
            sa_query::node_rec_get_table(core, sa, a, 1, &NodeRecord::default(), 0, t)
        }
        Query::PortInfo { table: false } => sa_query::portinfo_rec_get(
            core,
            sa,
            a,
            1,
            &PortInfoRecord {
                lid: B_LID,
                ..PortInfoRecord::default()
            },
            1,
            t,
        ),
        Query::PortInfo { table: true } => {
            sa_query::portinfo_rec_get_table(core, sa, a, 1, &PortInfoRecord::default(), 0, t)
        }
        Query::McMember { join } => {
            let mut rec = McMemberRecord::default();
            let (method, mask) = if join {
                // IPoIB's broadcast group of P_Key 0xffff.
                let mut mgid = [0u8; 16];
                mgid[..12].copy_from_slice(&[0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0]);
                mgid[12..].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
                rec.mgid = ib_core::verbs::Gid(mgid);
                rec.port_gid = core.device(a).unwrap().get_cached_gid(1, 0).unwrap();
                rec.join_state = 1;
                (ib_core::mad::method::SET, 0x1_0003)
            } else {
                (sa_method::GET_TABLE, 0)
            };
            sa_query::mcmember_rec_query(core, sa, a, 1, method, &rec, mask, t)
        }
    }
    .expect("the query starts");
    r.core.poll();
    // The request on the wire: its TID, attribute and method.
    let req = lock(&r.world)
        .wire
        .iter()
        .rev()
        .find(|p| p.from.0 == 0 && p.mad.mgmt_class() == class::SUBN_ADM)
        .map(|p| p.mad.clone())
        .expect("the query went out");
    let sm_lid = 1;
    let mut outcome = None;
    for ans in input.answers.iter().take(16) {
        let mut m = Mad::from_bytes(&req.0[..56]);
        m.set_method(if ans.table {
            sa_method::GET_TABLE_RESP
        } else {
            ib_core::mad::method::GET_RESP
        });
        m.set_status(ans.status);
        sa_query::set_attr_offset(&mut m, ans.attr_offset);
        if let Some((rtype, flags, seg, paylen)) = ans.rmpp {
            RmppHdr {
                version: 1,
                rtype: [
                    rmpp_type::DATA,
                    rmpp_type::ACK,
                    rmpp_type::STOP,
                    rmpp_type::ABORT,
                    rtype,
                ][usize::from(rtype) % 5],
                flags,
                status: 0,
                seg_num: u32::from(seg),
                paylen_newwin: u32::from(paylen),
            }
            .write(&mut m);
        } else {
            m.0[24..36].fill(0);
        }
        for (i, b) in ans.data.iter().take(200).enumerate() {
            m.0[56 + i] = *b;
        }
        for e in &ans.edits {
            legoib_fuzz::madgen::apply(&mut m, e, &[]);
        }
        r.clock
            .advance(Duration::from_micros(u64::from(ans.delay_us)));
        let grh = ans.grh.then(|| {
            let mut g = [0u8; 40];
            g[0] = 0x60;
            g
        });
        lock(&r.world).deliver(
            0,
            1,
            1,
            Arrival {
                grh,
                ..Arrival::mad(&m.0, 1, sm_lid)
            },
        );
        r.core.poll();
        if outcome.is_none() {
            outcome = sa_query::query_result(&mut r.core, sa, id);
        }
    }
    // Without a whole answer, the query ends by its deadline.
    let mut waited = 0;
    while outcome.is_none() && waited < 1000 {
        r.clock.advance(Duration::from_millis(1));
        r.core.poll();
        outcome = sa_query::query_result(&mut r.core, sa, id);
        waited += 1;
    }
    let outcome = outcome.expect("the query ended by its deadline");
    if let Ok(resp) = outcome {
        assert_eq!(resp.attr_id, req.attr_id());
        match resp.attr_id {
            sa_attr::PATH_REC => {
                if let Ok(paths) = resp.path_records() {
                    let dev = r.core.device(r.a).unwrap();
                    for p in &paths {
                        let _ = sa_query::init_ah_from_path(dev, 1, p);
                    }
                }
            }
            sa_attr::NODE_REC => {
                if let Ok(nodes) = resp.node_records() {
                    for n in &nodes {
                        let _ = n.desc();
                    }
                }
            }
            sa_attr::MC_MEMBER_REC => {
                if let Ok(groups) = resp.mcmember_records() {
                    let dev = r.core.device(r.a).unwrap();
                    for g in &groups {
                        let _ = ib_core::multicast::init_ah_from_mcmember(dev, 1, g);
                    }
                }
            }
            _ => {
                let _ = resp.portinfo_records();
            }
        }
    }
    let _ = sa_query::counters(&mut r.core, sa, r.a, 1);
}
