//! An SM's SubnSet(PortInfo) for driver tests.
//!
//! SMPs a port receives from the link, processed by the model's firmware SMA
//! (`SimHca::sma_receive`, every SMA check on); no state poke. Left out: the
//! driver's QP0 path (covered by the subnet tests with the fabric's embedded SM).

use sim::SimHca;

fn smp(method: u8, port: u8, data: &[u8; 64]) -> Vec<u8> {
    let mut m = vec![0u8; 256];
    m[0] = 1; // base version
    m[1] = 0x01; // LID-routed SM class
    m[2] = 1;
    m[3] = method;
    m[8..16].copy_from_slice(&0x5eed_u64.to_be_bytes());
    m[0x10..0x12].copy_from_slice(&0x0015u16.to_be_bytes()); // PortInfo
    m[0x14..0x18].copy_from_slice(&u32::from(port).to_be_bytes());
    m[0x40..0x80].copy_from_slice(data);
    m
}

/// Reads PortInfo, applies `edit` (PortState and PhysState start as "no
/// change") and sends it as a SubnSet; true if the SMA accepted it.
pub fn sm_port_info(hca: &SimHca, port: u8, edit: impl FnOnce(&mut [u8; 64])) -> bool {
    let Ok(got) = hca.sma_receive(port, &smp(0x01, port, &[0; 64])) else {
        return false;
    };
    let mut d = [0u8; 64];
    d.copy_from_slice(&got[0x40..0x80]);
    d[32] &= 0xf0;
    d[33] &= 0x0f;
    edit(&mut d);
    match hca.sma_receive(port, &smp(0x02, port, &d)) {
        Ok(r) => r[4] & 0x7f == 0 && r[5] == 0,
        Err(_) => false,
    }
}

/// Asks for PortState `state` (1 Down, 3 Armed, 4 Active).
pub fn sm_set_state(hca: &SimHca, port: u8, state: u8) -> bool {
    sm_port_info(hca, port, |d| d[32] |= state & 0xf)
}

/// What OpenSM does to bring a port up: LID and SM LID in one Set, then
/// Armed, then Active. False at the first step the SMA refuses or drops.
pub fn sm_activate(hca: &SimHca, port: u8, lid: u16, sm_lid: u16) -> bool {
    sm_port_info(hca, port, |d| {
        d[16..18].copy_from_slice(&lid.to_be_bytes());
        d[18..20].copy_from_slice(&sm_lid.to_be_bytes());
    }) && sm_set_state(hca, port, 3)
        && sm_set_state(hca, port, 4)
}
