//! Traps, after OpenSM's `osm_trap_rcv.c`: every Trap(Notice) is answered with a TrapRepress, and a link state change (128) or a local change (144) of a port makes the master sweep heavily.
//!
//! OpenSM's trap suppression (the event wheel), the ports it disables after
//! too many traps, the 129-131 port error handling and the reports to
//! InformInfo subscribers are left out.

use alloc::format;

use ib_core::mad::method;
use ib_core::{IbCore, MadAgent, MadRecvWc};

use crate::ib_types::sm_state;
use crate::sm::Sm;

/// Trap numbers that make the master sweep (`SM_LINK_STATE_CHANGED_TRAP`,
/// `SM_LOCAL_CHANGES_TRAP`).
pub const SWEEP_TRAPS: [u16; 2] = [128, 144];

impl Sm {
    /// A Trap(Notice) (`trap_rcv_process_request`).
    pub(crate) fn trap_rcv(&mut self, core: &mut IbCore, agent: MadAgent, r: &MadRecvWc, now: u64) {
        self.stats.traps += 1;
        let m = &r.mad;
        let d = m.smp_data();
        let generic = d[0] & 0x80 != 0;
        let num = u16::from_be_bytes([d[4], d[5]]);
        let issuer = u16::from_be_bytes([d[6], d[7]]);
        // TrapRepress: the request, method 0x07, no status.
        let mut resp = m.clone();
        resp.set_method(method::TRAP_REPRESS);
        resp.set_status(0);
        self.respond(core, agent, r, resp);
        if !generic {
            self.note(now, format!("Received Vendor Notice from LID {issuer}"));
            return;
        }
        let detail = match num {
            128 => format!(
                " (link state change at switch LID {})",
                u16::from_be_bytes([d[10], d[11]])
            ),
            144 => format!(
                " (local changes {:#04x}, capability mask {:#010x}, change flags {:#06x})",
                d[15],
                u32::from_be_bytes([d[16], d[17], d[18], d[19]]),
                u16::from_be_bytes([d[20], d[21]])
            ),
            _ => alloc::string::String::new(),
        };
        self.note(
            now,
            format!(
                "Received Generic Notice type:{} num:{num} from LID {issuer}{detail}",
                d[0] & 0x7f
            ),
        );
        if SWEEP_TRAPS.contains(&num) && self.state == sm_state::MASTER {
            self.note(now, format!("Forcing heavy sweep. Received trap:{num}"));
            self.request_heavy_sweep();
        }
    }
}
