//! Port of Linux `drivers/infiniband/core/smi.c` and `smi.h` (3.11): the directed-route SMP rules on send and on receive (IBTA Vol. 1 14.2.2) and the local/forward decision.
//!
//! The rules check the hop pointer, hop count, return path and permissive LIDs.
//! Nothing is left out, but forwarding itself (switches) is not done by this
//! port.

use crate::mad::{IB_SMP_MAX_PATH_HOPS, Mad};
use crate::verbs::{IB_LID_PERMISSIVE, NodeType};

/// `enum smi_action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmiAction {
    /// Drop the SMP.
    Discard,
    /// Go on with it.
    Handle,
}

/// `enum smi_forward_action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmiForwardAction {
    /// Give it to the local SMA/SM.
    Local,
    /// Let the send rules advance it (it is at the end of its DR segment).
    Send,
    /// A switch must forward it.
    Forward,
}

fn verdict(ok: bool) -> SmiAction {
    if ok {
        SmiAction::Handle
    } else {
        SmiAction::Discard
    }
}

/// `smi_handle_dr_smp_send`: the rules applied to an outgoing DR SMP
/// (C14-9 for requests, C14-13 for returning SMPs). Updates the hop pointer.
pub fn smi_handle_dr_smp_send(smp: &mut Mad, node_type: NodeType, port_num: u8) -> SmiAction {
    let hop_ptr = smp.hop_ptr();
    let hop_cnt = smp.hop_cnt();
    let switch = node_type == NodeType::Switch;
    // C14-6: hop counts 0..=63.
    if hop_cnt >= IB_SMP_MAX_PATH_HOPS {
        return SmiAction::Discard;
    }
    if !smp.smp_direction() {
        // C14-9:1 -- first hop: the source port must be the initial path's.
        if hop_cnt != 0 && hop_ptr == 0 {
            smp.set_hop_ptr(hop_ptr + 1);
            return verdict(smp.initial_path(hop_ptr + 1) == port_num);
        }
        // C14-9:2 -- intermediate hop: switches only.
        if hop_ptr != 0 && hop_ptr < hop_cnt {
            if !switch {
                return SmiAction::Discard;
            }
            smp.set_hop_ptr(hop_ptr + 1);
            return verdict(smp.initial_path(hop_ptr + 1) == port_num);
        }
        // C14-9:3 -- end of the directed-route part.
        if hop_ptr == hop_cnt {
            smp.set_hop_ptr(hop_ptr + 1);
            return verdict(switch || smp.dr_dlid() == IB_LID_PERMISSIVE);
        }
        // C14-9:4 -- hop_ptr == hop_cnt + 1: to the SMA/SM. C14-9:5 -- else fail.
        verdict(u16::from(hop_ptr) == u16::from(hop_cnt) + 1)
    } else {
        // C14-13:1 -- first hop back.
        if hop_cnt != 0 && u16::from(hop_ptr) == u16::from(hop_cnt) + 1 {
            smp.set_hop_ptr(hop_ptr - 1);
            return verdict(smp.return_path(hop_ptr - 1) == port_num);
        }
        // C14-13:2 -- intermediate hop: switches only.
        if 2 <= hop_ptr && hop_ptr <= hop_cnt {
            if !switch {
                return SmiAction::Discard;
            }
            smp.set_hop_ptr(hop_ptr - 1);
            return verdict(smp.return_path(hop_ptr - 1) == port_num);
        }
        // C14-13:3 -- end of the directed-route part.
        if hop_ptr == 1 {
            smp.set_hop_ptr(0);
            return verdict(switch || smp.dr_slid() == IB_LID_PERMISSIVE);
        }
        // C14-13:4 -- hop_ptr == 0: to the SM. C14-13:5 -- else fail.
        verdict(hop_ptr == 0)
    }
}

/// `smi_handle_dr_smp_recv`: the rules applied to an incoming DR SMP.
/// Records the return path; `phys_port_cnt` bounds the next hop of a switch.
pub fn smi_handle_dr_smp_recv(
    smp: &mut Mad,
    node_type: NodeType,
    port_num: u8,
    phys_port_cnt: u8,
) -> SmiAction {
    let hop_ptr = smp.hop_ptr();
    let hop_cnt = smp.hop_cnt();
    let switch = node_type == NodeType::Switch;
    if hop_cnt >= IB_SMP_MAX_PATH_HOPS {
        return SmiAction::Discard;
    }
    if !smp.smp_direction() {
        // C14-9:1 -- the sender should have incremented the hop pointer.
        if hop_cnt != 0 && hop_ptr == 0 {
            return SmiAction::Discard;
        }
        // C14-9:2 -- intermediate hop.
        if hop_ptr != 0 && hop_ptr < hop_cnt {
            if !switch {
                return SmiAction::Discard;
            }
            smp.set_return_path(hop_ptr, port_num);
            return verdict(smp.initial_path(hop_ptr + 1) <= phys_port_cnt);
        }
        // C14-9:3 -- end of the directed-route part.
        if hop_ptr == hop_cnt {
            if hop_cnt != 0 {
                smp.set_return_path(hop_ptr, port_num);
            }
            return verdict(switch || smp.dr_dlid() == IB_LID_PERMISSIVE);
        }
        // C14-9:4/5
        verdict(u16::from(hop_ptr) == u16::from(hop_cnt) + 1)
    } else {
        // C14-13:1 -- as Linux has it on receive too: step back and require
        // the return path to name the port it came in on.
        if hop_cnt != 0 && u16::from(hop_ptr) == u16::from(hop_cnt) + 1 {
            smp.set_hop_ptr(hop_ptr - 1);
            return verdict(smp.return_path(hop_ptr - 1) == port_num);
        }
        // C14-13:2 -- intermediate hop.
        if 2 <= hop_ptr && hop_ptr <= hop_cnt {
            if !switch {
                return SmiAction::Discard;
            }
            return verdict(smp.return_path(hop_ptr - 1) <= phys_port_cnt);
        }
        // C14-13:3 -- end of the directed-route part.
        if hop_ptr == 1 {
            if smp.dr_slid() == IB_LID_PERMISSIVE {
                // Giving the SMP to the SM: update the hop pointer.
                smp.set_hop_ptr(0);
                return SmiAction::Handle;
            }
            return verdict(switch);
        }
        // C14-13:4/5
        verdict(hop_ptr == 0)
    }
}

/// `smi_check_forward_dr_smp`: after the receive rules, is the SMP for us,
/// at the end of its DR segment, or to be forwarded?
pub fn smi_check_forward_dr_smp(smp: &Mad) -> SmiForwardAction {
    let hop_ptr = smp.hop_ptr();
    let hop_cnt = smp.hop_cnt();
    if !smp.smp_direction() {
        if hop_ptr != 0 && hop_ptr < hop_cnt {
            return SmiForwardAction::Forward;
        }
        if hop_ptr == hop_cnt {
            return if smp.dr_dlid() == IB_LID_PERMISSIVE {
                SmiForwardAction::Send
            } else {
                SmiForwardAction::Local
            };
        }
        if u16::from(hop_ptr) == u16::from(hop_cnt) + 1 {
            return SmiForwardAction::Send;
        }
    } else {
        if 2 <= hop_ptr && hop_ptr <= hop_cnt {
            return SmiForwardAction::Forward;
        }
        if hop_ptr == 1 {
            return if smp.dr_slid() != IB_LID_PERMISSIVE {
                SmiForwardAction::Send
            } else {
                SmiForwardAction::Local
            };
        }
    }
    SmiForwardAction::Local
}

/// `smi_check_local_smp`: an outgoing DR SMP that the send rules left at
/// `hop_ptr == hop_cnt + 1` going out (C14-9:3/4) is for this node's own
/// SMA and is handed to `process_mad` instead of the wire.
pub fn smi_check_local_smp(smp: &Mad, has_process_mad: bool) -> SmiAction {
    verdict(
        has_process_mad
            && !smp.smp_direction()
            && u16::from(smp.hop_ptr()) == u16::from(smp.hop_cnt()) + 1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mad::{class, method, status};

    fn dr(hop_cnt: u8, hop_ptr: u8, dir: bool) -> Mad {
        let mut m = Mad::new_request(class::SUBN_DIRECTED_ROUTE, 1, method::GET, 0x11, 0);
        m.set_hop_cnt(hop_cnt);
        m.set_hop_ptr(hop_ptr);
        m.set_dr_slid(IB_LID_PERMISSIVE);
        m.set_dr_dlid(IB_LID_PERMISSIVE);
        if dir {
            m.set_status(status::IB_SMP_DIRECTION);
        }
        m
    }

    /// An SM on CA A (port 1) asks CA B, two hops away through a switch
    /// (in on 3, out on 5), and B answers; every step as IBTA 14.2.2 walks it.
    #[test]
    fn two_hop_round_trip_through_a_switch() {
        let ca = NodeType::Ca;
        let sw = NodeType::Switch;
        let mut m = dr(2, 0, false);
        m.set_initial_path(1, 1);
        m.set_initial_path(2, 5);
        // A sends.
        assert_eq!(smi_handle_dr_smp_send(&mut m, ca, 1), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 1);
        assert_eq!(
            smi_check_local_smp(&m, true),
            SmiAction::Discard,
            "goes to the wire"
        );
        // The switch receives on 3, forwards on 5.
        assert_eq!(smi_handle_dr_smp_recv(&mut m, sw, 3, 36), SmiAction::Handle);
        assert_eq!(m.return_path(1), 3);
        assert_eq!(smi_check_forward_dr_smp(&m), SmiForwardAction::Forward);
        assert_eq!(smi_handle_dr_smp_send(&mut m, sw, 5), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 2);
        // B receives on its port 1; a CA cannot forward, it takes it.
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Handle);
        assert_eq!(m.return_path(2), 1);
        assert_eq!(smi_check_forward_dr_smp(&m), SmiForwardAction::Send);
        assert_eq!(smi_handle_dr_smp_send(&mut m, ca, 1), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 3);
        assert_eq!(
            smi_check_local_smp(&m, true),
            SmiAction::Handle,
            "to B's SMA"
        );
        // B's SMA answers: direction bit set, hop pointer unchanged.
        m.set_method(method::GET_RESP);
        m.set_status(status::IB_SMP_DIRECTION);
        assert_eq!(smi_handle_dr_smp_send(&mut m, ca, 1), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 2);
        assert_eq!(smi_check_local_smp(&m, true), SmiAction::Discard);
        // The switch receives on 5, sends back on 3.
        assert_eq!(smi_handle_dr_smp_recv(&mut m, sw, 5, 36), SmiAction::Handle);
        assert_eq!(smi_check_forward_dr_smp(&m), SmiForwardAction::Forward);
        assert_eq!(smi_handle_dr_smp_send(&mut m, sw, 3), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 1);
        // A receives: end of the DR part, DrSLID permissive: for the SM.
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Handle);
        assert_eq!(m.hop_ptr(), 0);
        assert_eq!(smi_check_forward_dr_smp(&m), SmiForwardAction::Local);
    }

    #[test]
    fn zero_hop_smp_is_local() {
        let mut m = dr(0, 0, false);
        assert_eq!(
            smi_handle_dr_smp_send(&mut m, NodeType::Ca, 1),
            SmiAction::Handle
        );
        assert_eq!(m.hop_ptr(), 1);
        assert_eq!(smi_check_local_smp(&m, true), SmiAction::Handle);
        assert_eq!(smi_check_local_smp(&m, false), SmiAction::Discard);
    }

    #[test]
    fn what_is_dropped() {
        let ca = NodeType::Ca;
        // Hop count 64.
        let mut m = dr(64, 0, false);
        assert_eq!(smi_handle_dr_smp_send(&mut m, ca, 1), SmiAction::Discard);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        // Wrong first hop port.
        let mut m = dr(1, 0, false);
        m.set_initial_path(1, 2);
        assert_eq!(smi_handle_dr_smp_send(&mut m, ca, 1), SmiAction::Discard);
        // Received with hop_ptr 0 although hops remain: the sender broke C14-9:1.
        let mut m = dr(2, 0, false);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        // A CA in the middle of a path.
        let mut m = dr(3, 1, false);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        // Unreasonable hop pointer.
        let mut m = dr(1, 9, false);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        let mut m = dr(1, 9, true);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        // End of path with a LID-routed part (DrDLID not permissive): CA drops.
        let mut m = dr(1, 1, false);
        m.set_dr_dlid(5);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        // Returning, hop_ptr == hop_cnt + 1 received: Linux steps back and
        // wants the return path to name the arrival port.
        let mut m = dr(1, 2, true);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
        assert_eq!(m.hop_ptr(), 1);
        let mut m = dr(1, 2, true);
        m.set_return_path(1, 1);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Handle);
        // Switch next hop beyond its ports.
        let mut m = dr(2, 1, false);
        m.set_initial_path(2, 40);
        assert_eq!(
            smi_handle_dr_smp_recv(&mut m, NodeType::Switch, 1, 36),
            SmiAction::Discard
        );
        // Returning SMP at hop 1 whose DrSLID is a LID: a CA drops it.
        let mut m = dr(1, 1, true);
        m.set_dr_slid(7);
        assert_eq!(smi_handle_dr_smp_recv(&mut m, ca, 1, 2), SmiAction::Discard);
    }
}
