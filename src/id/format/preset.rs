//! Two established ID layouts as presets.
//!
//! - `uniq64` (the UniqGenerator design's 64-bit ID): a u64 of year-2000
//!   (7 bits), month (4), day (5), hour (5), token (12) and serial (31),
//!   the serial reset daily. Bit positions are UniqGenerator's C bitfield
//!   as GCC and Clang lay it out on x86-64 and ARM64 (first field in the
//!   lowest bits), so values decode the same as that generator's own:
//!   `year` is bits 0-6, `serial` bits 33-63. The value is not
//!   time-ordered (the serial is on top), and with a serial of 2^30 or
//!   more it is above 2^63.
//! - `idc` (an ID center's decimal layout): a 19-digit decimal
//!   `SSSSSSSSSS CCCC MM T RR`, Unix seconds, a 4-digit counter reset
//!   every second, the machine (2 digits), a type digit and two digits
//!   left to the business for data routing, e.g.
//!   `1795392000-9998-01-1-00` (dashes for reading only). It is the
//!   template [`IDC_TEMPLATE`]; the original layout used 9-digit seconds
//!   since a private epoch, this uses Unix seconds so any reader can
//!   decode the time. It stays below 2^63 until 2262.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A preset's name, as given in a format definition (`preset = "idc"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PresetName {
    /// UniqGenerator's 64-bit layout ([`Uniq64`]).
    Uniq64,
    /// The ID center's 19-digit decimal layout ([`IDC_TEMPLATE`]).
    Idc,
}

/// The `idc` preset's template: `type` and `route` are the caller's.
pub const IDC_TEMPLATE: &str = "{unix_s}{seq:4}{node:2}{param:type:1:digits}{param:route:2:digits}";

/// Largest uniq64 token (12 bits).
pub const UNIQ64_MAX_TOKEN: u64 = (1 << 12) - 1;
/// Largest uniq64 serial (31 bits).
pub const UNIQ64_MAX_SERIAL: u64 = (1 << 31) - 1;

/// Why a preset value does not encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PresetError {
    /// A field outside its range.
    #[error("{preset} field {field} = {value} is out of range (0 to {max})")]
    FieldOutOfRange {
        /// `uniq64` or `idc`.
        preset: &'static str,
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Its largest value.
        max: u64,
    },
    /// A value that is no ID of the preset (month 0, hour 24, ...).
    #[error("{value} is not a {preset} ID: {why}")]
    NotAnId {
        /// `uniq64` or `idc`.
        preset: &'static str,
        /// The value.
        value: u64,
        /// What is wrong.
        why: &'static str,
    },
}

/// The fields of a uniq64 ID (UniqGenerator's bitfield).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Uniq64 {
    /// Year minus 2000 (0-127: 2000 to 2127).
    pub year: u8,
    /// Month 1-12.
    pub month: u8,
    /// Day 1-31.
    pub day: u8,
    /// Hour 0-23.
    pub hour: u8,
    /// The node's leased token (0-4095).
    pub token: u16,
    /// The serial, unique per token within a local day.
    pub serial: u32,
}

const U64_FIELDS: [(&str, u32, u32); 6] = [
    ("year", 0, 7),
    ("month", 7, 4),
    ("day", 11, 5),
    ("hour", 16, 5),
    ("token", 21, 12),
    ("serial", 33, 31),
];

impl Uniq64 {
    fn values(&self) -> [u64; 6] {
        [
            u64::from(self.year),
            u64::from(self.month),
            u64::from(self.day),
            u64::from(self.hour),
            u64::from(self.token),
            u64::from(self.serial),
        ]
    }

    /// The u64, after checking every field's range.
    pub fn encode(&self) -> Result<u64, PresetError> {
        let mut v = 0u64;
        for ((field, shift, bits), value) in U64_FIELDS.iter().zip(self.values()) {
            let max = (1u64 << bits) - 1;
            if value > max {
                return Err(PresetError::FieldOutOfRange {
                    preset: "uniq64",
                    field,
                    value,
                    max,
                });
            }
            v |= value << shift;
        }
        self.check(v)?;
        Ok(v)
    }

    fn check(&self, value: u64) -> Result<(), PresetError> {
        let why = if !(1..=12).contains(&self.month) {
            "month is not 1-12"
        } else if !(1..=31).contains(&self.day) {
            "day is not 1-31"
        } else if self.hour > 23 {
            "hour is not 0-23"
        } else {
            return Ok(());
        };
        Err(PresetError::NotAnId {
            preset: "uniq64",
            value,
            why,
        })
    }

    /// Splits a uniq64 value, refusing impossible dates and hours.
    pub fn decode(value: u64) -> Result<Uniq64, PresetError> {
        let f = |i: usize| {
            let (_, shift, bits) = U64_FIELDS[i];
            (value >> shift) & ((1u64 << bits) - 1)
        };
        // Each field is masked to its width, so the casts are lossless.
        let u = Uniq64 {
            year: f(0) as u8,
            month: f(1) as u8,
            day: f(2) as u8,
            hour: f(3) as u8,
            token: f(4) as u16,
            serial: f(5) as u32,
        };
        u.check(value)?;
        Ok(u)
    }

    /// The full year.
    pub fn full_year(&self) -> i32 {
        2000 + i32::from(self.year)
    }

    /// UniqGenerator's readable form: `uniq64://Y-M-D_H/token/serial`.
    pub fn uri(&self) -> String {
        format!(
            "uniq64://{}-{}-{}_{}/{}/{}",
            self.year, self.month, self.day, self.hour, self.token, self.serial
        )
    }
}

/// The fields of an idc ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Idc {
    /// Unix seconds (10 digits).
    pub seconds: u64,
    /// The counter within the second (0-9999).
    pub counter: u16,
    /// The machine (0-99).
    pub machine: u8,
    /// The type digit (0-9).
    pub kind: u8,
    /// Two digits for the business's data routing (0-99).
    pub route: u8,
}

impl Idc {
    /// The 19-digit number.
    pub fn encode(&self) -> Result<u64, PresetError> {
        let checks: [(&'static str, u64, u64); 5] = [
            ("seconds", self.seconds, 9_223_372_036),
            ("counter", u64::from(self.counter), 9999),
            ("machine", u64::from(self.machine), 99),
            ("type", u64::from(self.kind), 9),
            ("route", u64::from(self.route), 99),
        ];
        for (field, value, max) in checks {
            if value > max {
                return Err(PresetError::FieldOutOfRange {
                    preset: "idc",
                    field,
                    value,
                    max,
                });
            }
        }
        if self.seconds < 1_000_000_000 {
            return Err(PresetError::FieldOutOfRange {
                preset: "idc",
                field: "seconds",
                value: self.seconds,
                max: 9_223_372_036,
            });
        }
        let v = ((((self.seconds * 10_000 + u64::from(self.counter)) * 100
            + u64::from(self.machine))
            * 10
            + u64::from(self.kind))
            * 100)
            + u64::from(self.route);
        if v > i64::MAX as u64 {
            return Err(PresetError::NotAnId {
                preset: "idc",
                value: v,
                why: "it is above 2^63",
            });
        }
        Ok(v)
    }

    /// Splits an idc number.
    pub fn decode(value: u64) -> Result<Idc, PresetError> {
        if !(1_000_000_000_000_000_000..=i64::MAX as u64).contains(&value) {
            return Err(PresetError::NotAnId {
                preset: "idc",
                value,
                why: "it does not have 19 digits below 2^63",
            });
        }
        // Each part is reduced modulo its width, so the casts are lossless.
        Ok(Idc {
            route: (value % 100) as u8,
            kind: (value / 100 % 10) as u8,
            machine: (value / 1_000 % 100) as u8,
            counter: (value / 100_000 % 10_000) as u16,
            seconds: value / 1_000_000_000,
        })
    }
}

impl fmt::Display for Idc {
    /// The ID center's reading form: `seconds-counter-machine-type-route`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{:04}-{:02}-{}-{:02}",
            self.seconds, self.counter, self.machine, self.kind, self.route
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniq64_round_trips_and_uses_uniqgenerators_bit_positions() {
        let u = Uniq64 {
            year: 15,
            month: 4,
            day: 15,
            hour: 18,
            token: 4095,
            serial: UNIQ64_MAX_SERIAL as u32,
        };
        let v = u.encode().unwrap();
        assert_eq!(v & 0x7f, 15, "year in the lowest 7 bits");
        assert_eq!(v >> 33, UNIQ64_MAX_SERIAL, "serial in the top 31 bits");
        assert_eq!((v >> 21) & 0xfff, 4095);
        assert_eq!(Uniq64::decode(v).unwrap(), u);
        assert_eq!(u.uri(), "uniq64://15-4-15_18/4095/2147483647");
        assert_eq!(u.full_year(), 2015);
        // A walk over many values round-trips, and distinct fields give
        // distinct values.
        let mut seen = std::collections::HashSet::new();
        for i in 0..5000u32 {
            let u = Uniq64 {
                year: (i % 128) as u8,
                month: (i % 12 + 1) as u8,
                day: (i % 31 + 1) as u8,
                hour: (i % 24) as u8,
                token: (i * 7 % 4096) as u16,
                serial: i * 104_729,
            };
            let v = u.encode().unwrap();
            assert!(seen.insert(v));
            assert_eq!(Uniq64::decode(v).unwrap(), u);
        }
    }

    #[test]
    fn uniq64_refuses_out_of_range_fields_and_impossible_values() {
        let ok = Uniq64 {
            year: 26,
            month: 11,
            day: 23,
            hour: 10,
            token: 1,
            serial: 1,
        };
        for (bad, field) in [
            (Uniq64 { year: 128, ..ok }, "year"),
            (Uniq64 { token: 4096, ..ok }, "token"),
            (
                Uniq64 {
                    serial: 1 << 31,
                    ..ok
                },
                "serial",
            ),
        ] {
            assert!(
                matches!(bad.encode(), Err(PresetError::FieldOutOfRange { field: f, .. }) if f == field),
                "{field}"
            );
        }
        assert!(Uniq64 { month: 0, ..ok }.encode().is_err());
        assert!(Uniq64 { hour: 24, ..ok }.encode().is_err());
        assert!(matches!(
            Uniq64::decode(0),
            Err(PresetError::NotAnId { .. })
        ));
    }

    #[test]
    fn idc_round_trips_and_reads_like_the_id_center_layout() {
        let i = Idc {
            seconds: 1_795_392_000,
            counter: 9998,
            machine: 1,
            kind: 1,
            route: 0,
        };
        let v = i.encode().unwrap();
        assert_eq!(v, 1_795_392_000_999_801_100);
        assert_eq!(i.to_string(), "1795392000-9998-01-1-00");
        assert_eq!(Idc::decode(v).unwrap(), i);
        let last = Idc {
            seconds: 9_223_372_036,
            counter: 9999,
            machine: 99,
            kind: 9,
            route: 99,
        };
        assert!(last.encode().is_err(), "just above 2^63");
        let under = Idc {
            counter: 8547,
            machine: 75,
            kind: 8,
            route: 7,
            ..last
        };
        assert_eq!(under.encode().unwrap(), i64::MAX as u64);
        assert!(Idc::decode(12345).is_err());
        assert!(Idc { machine: 100, ..i }.encode().is_err());
        assert!(Idc {
            seconds: 999_999_999,
            ..i
        }
        .encode()
        .is_err());
    }
}
