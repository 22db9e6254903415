//! `s3` tier devices: a device whose bytes are objects in a bucket
//! (`backend/s3.rs`). Its spec is `s3:BUCKET[/PREFIX]:endpoint=URL
//! [:region=R][:size=SIZE]`, kept whole as the device's path (so the
//! pool's device record names the store); credentials and time limits
//! come from the pool's config (`ObjectOptions`), never from the spec.
//! Without `size=` the device has `DEFAULT_SLOTS` slots (unbounded for
//! practical purposes: 16 TiB of 4 MiB segments).

use crate::backend::{Backend, S3Backend};
use crate::class::{DeviceClass, DeviceRole};
use crate::device::{min_device_size, Device, DeviceSpec};
use crate::error::{DeviceError, Result};
use crate::header::{DeviceHeader, DATA_OFFSET, HEADER_LEN};
use cairn_objstore::{ClientOptions, Credentials, Locator, ObjectClient};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Slots of an s3 device given no `size=` (a slot map of 512 KiB in RAM).
pub const DEFAULT_SLOTS: u64 = 1 << 22;

/// How the pool reaches its object stores: the client's time limit and
/// retries, and where credentials come from (a 0600 file, else the
/// environment).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectOptions {
    pub client: ClientOptions,
    pub credentials_file: Option<PathBuf>,
}

/// Parses `s3:BUCKET[/PREFIX]:endpoint=URL[:region=R][:size=SIZE]`.
pub(crate) fn parse_s3_spec(spec: &str) -> Result<DeviceSpec> {
    let bad = |why: String| DeviceError::BadSpec {
        spec: spec.to_string(),
        why,
    };
    let (loc, extras) = Locator::parse_with_extras(spec).map_err(|e| bad(e.to_string()))?;
    let mut size = None;
    for (k, v) in extras {
        match k.as_str() {
            "size" => size = Some(crate::size::parse_size(&v).map_err(bad)?),
            "role" if v == "tier" => {}
            _ => {
                return Err(bad(format!(
                    "unknown option '{k}={v}' (an s3 device takes endpoint, region and size)"
                )))
            }
        }
    }
    Ok(DeviceSpec {
        class: DeviceClass::S3,
        path: PathBuf::from(canonical(&loc, size)),
        size,
        role: DeviceRole::Tier,
        emulate: None,
        sparse: false,
        domain: None,
        log: None,
    })
}

fn canonical(loc: &Locator, size: Option<u64>) -> String {
    match size {
        Some(s) => format!("{loc}:size={s}"),
        None => loc.to_string(),
    }
}

/// True if a device path names an object store.
pub fn is_object_path(path: &Path) -> bool {
    path.to_str()
        .is_some_and(cairn_objstore::locator::is_locator)
}

fn store_err(path: &Path) -> impl Fn(String) -> DeviceError + '_ {
    move |why| DeviceError::ObjectStore {
        path: path.to_path_buf(),
        why,
    }
}

/// Connects to the store a spec path names (no request yet).
fn connect(path: &Path, segment_size: u64, opts: &ObjectOptions) -> Result<Arc<S3Backend>> {
    let err = store_err(path);
    let spec: DeviceSpec = path.to_str().unwrap_or_default().parse()?;
    let text = spec.path.to_string_lossy().to_string();
    let (loc, _) = Locator::parse_with_extras(&text).map_err(|e| err(e.to_string()))?;
    let creds =
        Credentials::resolve(opts.credentials_file.as_deref()).map_err(|e| err(e.to_string()))?;
    let client = ObjectClient::new(&loc, &creds, opts.client).map_err(|e| err(e.to_string()))?;
    Ok(S3Backend::new(client, DATA_OFFSET, segment_size))
}

/// The device's size: `size=` rounded down to whole slots, else
/// `DEFAULT_SLOTS` slots.
fn device_size(spec: &DeviceSpec, segment_size: u64) -> Result<u64> {
    let size = spec
        .size
        .unwrap_or(DATA_OFFSET + DEFAULT_SLOTS * segment_size);
    let size = DATA_OFFSET + (size.saturating_sub(DATA_OFFSET) / segment_size) * segment_size;
    let min = min_device_size(segment_size);
    if size < min {
        return Err(DeviceError::TooSmall {
            path: spec.path.clone(),
            size,
            min,
        });
    }
    Ok(size)
}

/// Creates an s3 device: refuses a prefix that already holds a Cairn
/// header or slot objects, then uploads the header (verified).
pub fn create_object(
    spec: &DeviceSpec,
    device_id: u32,
    pool_uuid: [u8; 16],
    segment_size: u64,
    opts: &ObjectOptions,
) -> Result<Device> {
    let path = spec.path.clone();
    let err = store_err(&path);
    let io = connect(&path, segment_size, opts)?;
    if io.header_exists().map_err(|e| err(e.to_string()))? {
        return Err(err(
            "the bucket prefix already holds a Cairn device header; refusing to overwrite it (use another prefix)".into(),
        ));
    }
    let slots = crate::backend::ObjectTier::list_slots(&*io).map_err(|e| err(e.to_string()))?;
    if !slots.is_empty() {
        return Err(err(format!(
            "the bucket prefix already holds {} Cairn slot objects; refusing to use it (use another prefix)",
            slots.len()
        )));
    }
    let size = device_size(spec, segment_size)?;
    let header = DeviceHeader {
        device_id,
        pool_uuid,
        class: DeviceClass::S3,
        size,
        segment_size,
        data_offset: DATA_OFFSET,
        log_offset: 0,
        log_len: 0,
    };
    // What is written is what `open` accepts.
    assert_eq!(
        header.check_geometry(),
        Ok(()),
        "s3 device header {header:?}"
    );
    io.set_len(size).map_err(|e| err(e.to_string()))?;
    io.write_at(&header.encode(), 0)
        .map_err(|e| err(e.to_string()))?;
    io.sync_data().map_err(|e| err(e.to_string()))?;
    Ok(Device::from_parts(
        header,
        spec.path.clone(),
        DeviceRole::Tier,
        io,
    ))
}

/// Opens an s3 device and checks its header object. When the store does
/// not answer, `expected` (the header the pool's record implies) stands
/// in, so the pool opens with the tier unreachable (its reads fail, its
/// state says so) rather than not at all.
pub fn open_object(
    path: &Path,
    pool_uuid: [u8; 16],
    segment_size: u64,
    expected: Option<DeviceHeader>,
    opts: &ObjectOptions,
) -> Result<Device> {
    let io = connect(path, segment_size, opts)?;
    let mut buf = vec![0u8; HEADER_LEN];
    let header = match io.read_at(&mut buf, 0) {
        Ok(()) => DeviceHeader::decode(&buf, path)?,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
            })
        }
        Err(e) => match expected {
            Some(h) if !crate::backend::ObjectTier::reachable(&*io) => {
                tracing::warn!(
                    "{}: object store unreachable ({e}); the tier opens offline",
                    path.display()
                );
                h
            }
            _ => return Err(store_err(path)(e.to_string())),
        },
    };
    if header.pool_uuid != pool_uuid {
        return Err(DeviceError::WrongPool {
            path: path.to_path_buf(),
        });
    }
    io.set_len(header.size)
        .map_err(|e| store_err(path)(e.to_string()))?;
    Ok(Device::from_parts(
        header,
        path.to_path_buf(),
        DeviceRole::Tier,
        io,
    ))
}

/// The header an s3 device of this record has (for `open_object`).
pub fn expected_header(
    path: &Path,
    device_id: u32,
    pool_uuid: [u8; 16],
    segment_size: u64,
) -> Result<DeviceHeader> {
    let spec: DeviceSpec = path.to_str().unwrap_or_default().parse()?;
    Ok(DeviceHeader {
        device_id,
        pool_uuid,
        class: DeviceClass::S3,
        size: device_size(&spec, segment_size)?,
        segment_size,
        data_offset: DATA_OFFSET,
        log_offset: 0,
        log_len: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_specs() {
        let s: DeviceSpec = "s3:bkt/p:endpoint=http://127.0.0.1:9000:size=1G"
            .parse()
            .unwrap();
        assert_eq!(
            (s.class, s.size, s.role),
            (DeviceClass::S3, Some(1 << 30), DeviceRole::Tier)
        );
        assert_eq!(
            s.path,
            PathBuf::from(
                "s3:bkt/p:endpoint=http://127.0.0.1:9000:region=us-east-1:size=1073741824"
            )
        );
        assert_eq!(s.to_string().parse::<DeviceSpec>().unwrap(), s);
        assert!(is_object_path(&s.path));
        assert!("s3:bkt:endpoint=http://x:role=cache"
            .parse::<DeviceSpec>()
            .is_err());
        assert!("s3:bkt:endpoint=http://x:latency=1ms"
            .parse::<DeviceSpec>()
            .is_err());
        assert!("s3:bkt".parse::<DeviceSpec>().is_err());
        let h = expected_header(&s.path, 3, [1; 16], 1 << 20).unwrap();
        assert_eq!(h.slot_count(), 1023);
    }
}
