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
    /// An object store (S3 API): always the slowest tier, filled only by
    /// the mover's demotions.
    S3,
}

impl DeviceClass {
    /// Rank used for placement: 0 is the fastest.
    pub fn rank(self) -> u8 {
        match self {
            DeviceClass::Nvme => 0,
            DeviceClass::Ssd => 1,
            DeviceClass::Hdd => 2,
            DeviceClass::S3 => 3,
        }
    }

    /// True for an object store (`s3`): no new segments are placed on it
    /// (only whole sealed segments moved there).
    pub fn is_object_store(self) -> bool {
        self == DeviceClass::S3
    }

    pub fn from_rank(r: u8) -> Option<Self> {
        match r {
            0 => Some(DeviceClass::Nvme),
            1 => Some(DeviceClass::Ssd),
            2 => Some(DeviceClass::Hdd),
            3 => Some(DeviceClass::S3),
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
            DeviceClass::S3 => "s3",
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
            "s3" => Ok(DeviceClass::S3),
            other => Err(format!(
                "unknown device class '{other}' (use nvme, ssd, hdd or s3)"
            )),
        }
    }
}

/// What a device is for: a `tier` stores segments and adds its capacity to
/// the pool; a `cache` holds copies of hot chunks whose home is a slower
/// tier device and adds no capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRole {
    #[default]
    Tier,
    Cache,
}

impl fmt::Display for DeviceRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceRole::Tier => "tier",
            DeviceRole::Cache => "cache",
        })
    }
}

impl FromStr for DeviceRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tier" => Ok(DeviceRole::Tier),
            "cache" => Ok(DeviceRole::Cache),
            other => Err(format!("unknown device role '{other}' (use tier or cache)")),
        }
    }
}
