//! Device drivers: console UART, interrupt controllers, generic timer, PMU.

pub mod bcm2711_gpio;
pub mod gic;
pub mod interrupts;
pub mod pl011;
pub mod pmu;
pub mod timer;
