//! Firmware commands through the HCR, polled, as Linux's `cmd.c` posts them.
//!
//! Linux: `cmd.c` (`mlx4_cmd_post`, `mlx4_cmd_poll`, `mlx4_status_to_errno`,
//! mailboxes). Event-driven commands, the SR-IOV comm channel and command
//! wrappers are left out.
//!
//! Commands are strictly serialized: every command takes `&mut Cmd`, which
//! the device owns once. As in Linux's polling mode, posting does not wait for
//! a busy HCR (`-EAGAIN` becomes [`Error::CmdBusy`]); completion is polled on
//! the GO bit against a [`Deadline`] of the command's Linux timeout class.
//! Each command logs one `debug` line: name, modifiers, status, microseconds.

use alloc::sync::Arc;
use core::time::Duration;

use hal::barrier::wmb;
use hal::{Bar, BusAddr, Clock, Deadline, DmaBuf, DmaPool};
use mlx4_hw::cmd::{MAILBOX_SIZE, Opcode, Status};
use mlx4_hw::hcr::*;

use crate::{Error, Result, mlx4_dbg, mlx4_err};

/// A 4 KiB command mailbox in DMA memory (Linux `mlx4_cmd_mailbox`).
pub struct Mailbox {
    buf: DmaBuf,
}

impl Mailbox {
    /// A zeroed mailbox from `pool` (Linux `mlx4_alloc_cmd_mailbox`).
    pub fn new(pool: &DmaPool) -> Result<Mailbox> {
        Ok(Mailbox {
            buf: pool.alloc(MAILBOX_SIZE, MAILBOX_SIZE)?,
        })
    }
    /// Its bus address (the HCR in/out parameter).
    pub fn dma(&self) -> u64 {
        self.buf.bus_addr().0
    }
    /// Copies `src` in at `off`.
    pub fn write(&self, off: usize, src: &[u8]) {
        self.buf.write_bytes(off, src);
    }
    /// Copies the first `N` bytes out.
    pub fn read<const N: usize>(&self) -> [u8; N] {
        let mut b = [0u8; N];
        self.buf.read_bytes(0, &mut b);
        b
    }
    /// Copies `dst.len()` bytes out from `off`.
    pub fn read_into(&self, off: usize, dst: &mut [u8]) {
        self.buf.read_bytes(off, dst);
    }
    /// Zeroes the first `len` bytes.
    pub fn clear(&self, len: usize) {
        self.buf.fill(0, len, 0);
    }
}

/// How the output parameter is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// No output (Linux `mlx4_cmd`).
    None,
    /// An output mailbox at this bus address (Linux `mlx4_cmd_box`).
    Mailbox(u64),
    /// An immediate 64-bit result read back from the HCR (`mlx4_cmd_imm`).
    Imm,
}

/// The command interface (Linux `struct mlx4_cmd`, polling mode only).
pub struct Cmd {
    hcr: Bar,
    toggle: bool,
    clock: Arc<dyn Clock>,
    name: hal::PciAddress,
    /// Commands posted since probe.
    pub issued: u64,
    /// `max_cmds` reported by QUERY_FW (event mode only; recorded).
    pub max_cmds: u32,
}

impl Cmd {
    /// Linux `mlx4_cmd_init`: the HCR window, toggle 1, polling mode.
    pub fn new(hcr: Bar, clock: Arc<dyn Clock>, name: hal::PciAddress) -> Cmd {
        Cmd {
            hcr,
            toggle: true,
            clock,
            name,
            issued: 0,
            max_cmds: 1,
        }
    }

    fn pending(&self) -> bool {
        is_pending(self.hcr.read_be32(HCR_STATUS_OFFSET), self.toggle)
    }

    /// Linux `mlx4_cmd_post`: fails at once if the HCR is busy, writes dwords
    /// 0..5, a write barrier, then the GO/toggle/opcode dword, and flips the
    /// toggle.
    fn post(
        &mut self,
        in_param: u64,
        out_param: u64,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
    ) -> Result<()> {
        if self.pending() {
            mlx4_err!(self.name, "{}: cmd_pending failed", op);
            return Err(Error::CmdBusy { op });
        }
        let h = &self.hcr;
        h.write_be32(HCR_IN_PARAM_OFFSET, (in_param >> 32) as u32);
        h.write_be32(HCR_IN_PARAM_OFFSET + 4, in_param as u32);
        h.write_be32(HCR_IN_MODIFIER_OFFSET, in_mod);
        h.write_be32(HCR_OUT_PARAM_OFFSET, (out_param >> 32) as u32);
        h.write_be32(HCR_OUT_PARAM_OFFSET + 4, out_param as u32);
        h.write_be32(HCR_TOKEN_OFFSET, u32::from(CMD_POLL_TOKEN) << 16);
        // The GO bit must not reach the device before the parameters.
        wmb();
        h.write_be32(
            HCR_STATUS_OFFSET,
            status_word(op.0, op_mod, self.toggle, false),
        );
        self.toggle = !self.toggle;
        self.issued += 1;
        Ok(())
    }

    /// Linux `mlx4_cmd_poll` (via `__mlx4_cmd`): posts, polls GO until
    /// `timeout_ms`, reads the immediate output if asked, maps the status.
    pub fn exec(
        &mut self,
        in_param: u64,
        out: Out,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
        timeout_ms: u32,
    ) -> Result<u64> {
        let start = self.clock.now_ns();
        let out_param = match out {
            Out::Mailbox(a) => a,
            _ => 0,
        };
        let r = self.post(in_param, out_param, in_mod, op_mod, op);
        if let Err(e) = r {
            self.log(op, in_mod, op_mod, None, start);
            return Err(e);
        }
        let deadline = Deadline::after(&*self.clock, Duration::from_millis(u64::from(timeout_ms)));
        loop {
            let expired = deadline.expired(&*self.clock);
            if !self.pending() {
                break;
            }
            if expired {
                self.log(op, in_mod, op_mod, None, start);
                mlx4_err!(
                    self.name,
                    "command {} ({:#x}) timed out (go bit not cleared)",
                    op,
                    op.0
                );
                return Err(Error::CmdTimeout { op });
            }
            self.clock.relax();
        }
        let imm = if out == Out::Imm {
            (u64::from(self.hcr.read_be32(HCR_OUT_PARAM_OFFSET)) << 32)
                | u64::from(self.hcr.read_be32(HCR_OUT_PARAM_OFFSET + 4))
        } else {
            0
        };
        let status = Status::from_u8(status_of(self.hcr.read_be32(HCR_STATUS_OFFSET)));
        self.log(op, in_mod, op_mod, Some(status), start);
        if status != Status::Ok {
            mlx4_err!(
                self.name,
                "command {} ({:#x}) failed: in_param={:#x}, in_mod={:#x}, op_mod={:#x}, fw status = {}",
                op,
                op.0,
                in_param,
                in_mod,
                op_mod,
                status
            );
            return Err(Error::Fw { op, status });
        }
        Ok(imm)
    }

    fn log(&self, op: Opcode, in_mod: u32, op_mod: u8, status: Option<Status>, start: u64) {
        let us = self.clock.now_ns().saturating_sub(start) / 1000;
        match status {
            Some(s) => mlx4_dbg!(
                self.name,
                "cmd {} ({:#x}) in_mod={:#x} op_mod={:#x} status={} {}us",
                op,
                op.0,
                in_mod,
                op_mod,
                s,
                us
            ),
            None => mlx4_dbg!(
                self.name,
                "cmd {} ({:#x}) in_mod={:#x} op_mod={:#x} status=none {}us",
                op,
                op.0,
                in_mod,
                op_mod,
                us
            ),
        }
    }

    /// Linux `mlx4_cmd`: no output.
    pub fn cmd(
        &mut self,
        in_param: u64,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
        timeout_ms: u32,
    ) -> Result<()> {
        self.exec(in_param, Out::None, in_mod, op_mod, op, timeout_ms)
            .map(|_| ())
    }

    /// Linux `mlx4_cmd_box`: output mailbox at `out` (bus address, 0 for none).
    pub fn cmd_box(
        &mut self,
        in_param: u64,
        out: u64,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
        timeout_ms: u32,
    ) -> Result<()> {
        self.exec(in_param, Out::Mailbox(out), in_mod, op_mod, op, timeout_ms)
            .map(|_| ())
    }

    /// Linux `mlx4_cmd_imm`: immediate 64-bit output.
    pub fn cmd_imm(
        &mut self,
        in_param: u64,
        in_mod: u32,
        op_mod: u8,
        op: Opcode,
        timeout_ms: u32,
    ) -> Result<u64> {
        self.exec(in_param, Out::Imm, in_mod, op_mod, op, timeout_ms)
    }

    /// The clock commands are timed with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }
}

/// A bus address as the 64-bit HCR parameter.
pub fn bus(a: BusAddr) -> u64 {
    a.0
}

#[cfg(test)]
pub(crate) mod tests {
    //! A tiny fake HCR: completes commands with a programmable status, or
    //! never (GO stuck), and records what was posted.
    use super::*;
    use alloc::vec::Vec;
    use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use hal::RegisterBackend;
    use hal::fake::{FakeClock, MemBar};
    use std::sync::Mutex;

    /// (opcode, op_mod, in_mod, in_param, out_param) of each post.
    pub type Posted = (u16, u8, u32, u64, u64);

    #[derive(Default)]
    pub struct FakeHcr {
        pub mem: Vec<AtomicU32>,
        pub status: AtomicU32,
        /// Posts before this index complete with status 0.
        pub status_from: AtomicU32,
        pub stuck: AtomicBool,
        pub imm: Mutex<u64>,
        pub posted: Mutex<Vec<Posted>>,
    }

    impl FakeHcr {
        pub fn new() -> Arc<FakeHcr> {
            Arc::new(FakeHcr {
                mem: (0..7).map(|_| AtomicU32::new(0)).collect(),
                ..Default::default()
            })
        }
        fn r(&self, i: usize) -> u32 {
            u32::from_be(self.mem[i].load(Ordering::SeqCst))
        }
    }

    impl RegisterBackend for FakeHcr {
        fn read32(&self, off: usize) -> u32 {
            self.mem[off / 4].load(Ordering::SeqCst)
        }
        fn write32(&self, off: usize, v: u32) {
            self.mem[off / 4].store(v, Ordering::SeqCst);
            if off == HCR_STATUS_OFFSET {
                let w = u32::from_be(v);
                let in_param = (u64::from(self.r(0)) << 32) | u64::from(self.r(1));
                let out_param = (u64::from(self.r(3)) << 32) | u64::from(self.r(4));
                let n = self.posted.lock().unwrap().len() as u32;
                self.posted.lock().unwrap().push((
                    (w & 0xfff) as u16,
                    ((w >> 12) & 0xf) as u8,
                    self.r(2),
                    in_param,
                    out_param,
                ));
                if self.stuck.load(Ordering::SeqCst) {
                    return;
                }
                let imm = *self.imm.lock().unwrap();
                self.mem[3].store(((imm >> 32) as u32).to_be(), Ordering::SeqCst);
                self.mem[4].store((imm as u32).to_be(), Ordering::SeqCst);
                let t = w & (1 << HCR_T_BIT);
                let st = if n >= self.status_from.load(Ordering::SeqCst) {
                    self.status.load(Ordering::SeqCst) << 24
                } else {
                    0
                };
                self.mem[6].store((st | t).to_be(), Ordering::SeqCst);
            }
        }
    }

    pub fn setup() -> (Arc<FakeHcr>, Arc<FakeClock>, Cmd) {
        let hcr = FakeHcr::new();
        let clock = Arc::new(FakeClock::with_relax_step(Duration::from_micros(10)));
        let bar = Bar::from_backend(hcr.clone(), HCR_SIZE);
        let cmd = Cmd::new(bar, clock.clone(), hal::PciAddress::default());
        (hcr, clock, cmd)
    }

    #[test]
    fn posts_in_linux_order_and_toggles() {
        let (hcr, _, mut cmd) = setup();
        *hcr.imm.lock().unwrap() = 0x1234_5678_9abc_def0;
        let v = cmd
            .cmd_imm(0x1_0000_0000, 7, 2, Opcode::SET_ICM_SIZE, 10_000)
            .unwrap();
        assert_eq!(v, 0x1234_5678_9abc_def0);
        cmd.cmd(0, 0x1f, 0, Opcode::NOP, 100).unwrap();
        let p = hcr.posted.lock().unwrap().clone();
        assert_eq!(p[0], (0xffd, 2, 7, 0x1_0000_0000, 0));
        assert_eq!(p[1].0, 0x031);
        assert_eq!(cmd.issued, 2);
        // Toggle went 1 then 0: the last write had T clear.
        assert_eq!(hcr.r(6) & (1 << HCR_T_BIT), 0);
        assert_eq!(hcr.r(5), 0xffff_0000);
    }

    #[test]
    fn status_becomes_fw_error() {
        let (hcr, _, mut cmd) = setup();
        hcr.status.store(0x0c, Ordering::SeqCst);
        let e = cmd.cmd(0, 0, 0, Opcode::MAP_ICM_AUX, 10_000).unwrap_err();
        assert_eq!(
            e,
            Error::Fw {
                op: Opcode::MAP_ICM_AUX,
                status: Status::IcmError
            }
        );
        assert_eq!(e.to_errno(), -23);
    }

    #[test]
    fn stuck_go_times_out_at_the_deadline_and_next_post_is_busy() {
        let (hcr, clock, mut cmd) = setup();
        hcr.stuck.store(true, Ordering::SeqCst);
        let t0 = clock.now_ns();
        let e = cmd.cmd(0, 0, 0, Opcode::RUN_FW, 10_000).unwrap_err();
        assert_eq!(e, Error::CmdTimeout { op: Opcode::RUN_FW });
        let waited = clock.now_ns() - t0;
        assert!(
            (10_000_000_000..10_000_100_000).contains(&waited),
            "{waited}"
        );
        let t1 = clock.now_ns();
        let e = cmd.cmd(0, 0, 0, Opcode::NOP, 100).unwrap_err();
        assert_eq!(e, Error::CmdBusy { op: Opcode::NOP });
        assert_eq!(clock.now_ns(), t1, "a busy HCR is not waited for");
        let _ = MemBar::new(4);
    }
}
