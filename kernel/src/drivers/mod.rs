//! Device drivers: console UART, interrupt controllers, generic timer.

pub mod bcm2711_gpio;
pub mod gic;
pub mod interrupts;
pub mod pl011;
pub mod timer;
