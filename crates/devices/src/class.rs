//! Device speed classes. Lower rank is faster; placement prefers low ranks.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    Nvme,
    Ssd,
    Hdd,
}

impl DeviceClass {
    /// Rank used for placement: 0 is the fastest.
    pub fn rank(self) -> u8 {
        match self {
            DeviceClass::Nvme => 0,
            DeviceClass::Ssd => 1,
            DeviceClass::Hdd => 2,
        }
    }

    pub fn from_rank(r: u8) -> Option<Self> {
        match r {
            0 => Some(DeviceClass::Nvme),
            1 => Some(DeviceClass::Ssd),
            2 => Some(DeviceClass::Hdd),
            _ => None,
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceClass::Nvme => "nvme",
            DeviceClass::Ssd => "ssd",
            DeviceClass::Hdd => "hdd",
        })
    }
}

impl FromStr for DeviceClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nvme" => Ok(DeviceClass::Nvme),
            "ssd" => Ok(DeviceClass::Ssd),
            "hdd" => Ok(DeviceClass::Hdd),
            other => Err(format!(
                "unknown device class '{other}' (use nvme, ssd or hdd)"
            )),
        }
    }
}
