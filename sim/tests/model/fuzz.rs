//! Robustness: thousands of random commands, mailboxes and register writes
//! must never panic the model, and it must keep answering.

use crate::harness::*;
use sim::Opcode;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_commands_never_panic_the_model() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut r = Raw::new();
    init_full(&mut r).unwrap();
    let mbox = r.inbox.bus_addr().0;
    let out = r.outbox.bus_addr().0;
    let mut mailbox = vec![0u8; 4096];
    for round in 0..3000 {
        let op = match rng.below(4) {
            0 => Opcode(rng.below(0x1000) as u16),
            _ => Opcode::ALL[rng.below(Opcode::ALL.len() as u64) as usize],
        };
        // Never let the fuzzer reset or close the device before the end.
        if [Opcode::CLOSE_HCA, Opcode::UNMAP_ICM_AUX, Opcode::UNMAP_FA].contains(&op)
            && round < 2900
        {
            continue;
        }
        for b in mailbox.iter_mut().take(512) {
            *b = rng.next() as u8;
        }
        // Sometimes a plausible small count / index, sometimes anything.
        let in_mod = match rng.below(3) {
            0 => rng.below(300) as u32,
            1 => rng.next() as u32,
            _ => rng.below(4) as u32,
        };
        let in_param = match rng.below(4) {
            0 => rng.next(),
            _ => mbox,
        };
        let out_param = if rng.below(5) == 0 { rng.next() } else { out };
        r.inbox.write_bytes(0, &mailbox);
        let op_mod = rng.below(16) as u8;
        let res = r.post(in_param, out_param, in_mod, op_mod, op);
        assert!(
            !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
            "round {round}: {op} -> {res:?}"
        );
    }
    // Random doorbells and register stores (not the reset dword).
    for _ in 0..2000 {
        let off = (rng.below(8 << 20) as usize) & !3;
        r.bar2.write32(off, rng.next() as u32);
        let off0 = (rng.below(1 << 20) as usize) & !3;
        if !(0xf_0000..0xf_0400).contains(&off0) && !(0x8_0680..0x8_06a0).contains(&off0) {
            r.bar0.write32(off0, rng.next() as u32);
        }
    }
    // Still alive: a NOP goes through (or is refused with a status).
    let res = r.post(0, 0, 0x1f, 0, Opcode::NOP);
    assert!(
        !matches!(res, Err(CmdError::Timeout) | Err(CmdError::Busy)),
        "{res:?}"
    );
    assert!(!r.sim.trace().is_empty());
}
