//! 16550 UART on COM1, polled (115200 8N1, FIFOs on, no interrupts).

use crate::arch::port::{inb, outb};
use core::fmt;

const COM1: u16 = 0x3f8;
const LSR: u16 = 5;
const LSR_DATA_READY: u8 = 1 << 0;
const LSR_THR_EMPTY: u8 = 1 << 5;

/// The console UART.
pub struct Serial {
    base: u16,
}

static PORT: spin::Mutex<Serial> = spin::Mutex::new(Serial { base: COM1 });

impl Serial {
    fn init(&self) {
        let b = self.base;
        outb(b + 1, 0x00); // no interrupts
        outb(b + 3, 0x80); // DLAB
        outb(b, 0x01); // divisor 1: 115200 baud
        outb(b + 1, 0x00);
        outb(b + 3, 0x03); // 8N1
        outb(b + 2, 0xc7); // FIFO on, cleared, 14-byte threshold
        outb(b + 4, 0x03); // DTR, RTS
    }

    fn put(&self, byte: u8) {
        // Bounded: a missing UART must not hang the kernel.
        for _ in 0..100_000 {
            if inb(self.base + LSR) & LSR_THR_EMPTY != 0 {
                break;
            }
            core::hint::spin_loop();
        }
        outb(self.base, byte);
    }

    fn write_bytes(&self, s: &[u8]) {
        for &b in s {
            if b == b'\n' {
                self.put(b'\r');
            }
            self.put(b);
        }
    }
}

/// Programs COM1.
pub fn init() {
    PORT.lock().init();
}

/// Writes `s` to the console (LF becomes CRLF).
pub fn write_str(s: &str) {
    PORT.lock().write_bytes(s.as_bytes());
}

/// Writes `s` even if the console lock is held (for the panic and exception
/// paths, which may interrupt a writer).
pub fn write_str_emergency(s: &str) {
    Serial { base: COM1 }.write_bytes(s.as_bytes());
}

/// A received byte, if one is waiting.
pub fn try_read() -> Option<u8> {
    let p = PORT.lock();
    (inb(p.base + LSR) & LSR_DATA_READY != 0).then(|| inb(p.base))
}

/// `fmt::Write` onto the console.
pub struct Console;

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_str(s);
        Ok(())
    }
}

/// `fmt::Write` onto the console that ignores the lock (panic path).
pub struct EmergencyConsole;

impl fmt::Write for EmergencyConsole {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_str_emergency(s);
        Ok(())
    }
}

/// `print!` to the serial console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::serial::Console, format_args!($($arg)*));
    }};
}

/// `println!` to the serial console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::print!("{}\n", format_args!($($arg)*));
    }};
}
