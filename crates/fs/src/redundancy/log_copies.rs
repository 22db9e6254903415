//! The intent log's copies on devices as devices come and go while
//! mounted: a device added with `:log=SIZE` (or replacing a device that
//! held a copy) starts holding one at once; a device removed stops, and
//! may not take the log's last copy with it. Which devices hold a copy is
//! in their records (`DeviceDesc::log`) and headers; the log itself is
//! `writeback/log_file.rs`, placed at mkfs by `pool/log_home.rs`.

use crate::error::{FsError, Result};
use crate::vfs::Fs;
use crate::writeback::log_file::{prepare_area, Place};
use cairn_devices::{Device, DeviceSpec};

impl Fs {
    /// Whether the running log is kept on devices (else in the pool
    /// directory's file, or there is none).
    fn log_on_devices(&self) -> bool {
        !self.pool.log_devices.is_empty()
    }

    /// Refuses a device spec asking for a log area in a pool whose log is
    /// the pool directory's file (moving it to devices is not done online).
    pub(crate) fn check_log_spec(&self, spec: &DeviceSpec) -> Result<()> {
        if spec.log.is_some() && !self.log_on_devices() {
            return Err(FsError::BadRequest(format!(
                "{}: this pool keeps its intent log in the pool directory, not on devices; \
                 leave out :log=",
                spec.path.display()
            )));
        }
        Ok(())
    }

    /// The log area a device replacing `old` gets: the one `old` had
    /// when it held a copy of the log (the running log's size when it is
    /// missing), unless the spec names one.
    pub(crate) fn inherit_log_area(&self, old: &Device, spec: &mut DeviceSpec) {
        if spec.log.is_some() || !self.pool.log_devices.contains(&old.id()) {
            return;
        }
        let running = self.intent.as_ref().map(|l| l.lock().region_len() * 2);
        spec.log = Some(match old.header.log_len {
            0 => running.unwrap_or(cairn_devices::MIN_LOG_AREA),
            n => n,
        });
    }

    /// A device just added with a log area starts holding a copy: its
    /// area is readied and every record from now on goes there too.
    pub(crate) fn log_copy_joins(&self, dev: &Device) -> Result<()> {
        let Some(area) = dev.log_area() else {
            return Ok(());
        };
        if !dev.is_sparse() {
            prepare_area(&*area)
                .map_err(|e| FsError::Io(format!("{}: {e}", dev.path.display())))?;
        }
        if let Some(log) = &self.intent {
            let place = Place {
                name: dev.path.clone(),
                io: area,
                shared: true,
            };
            log.lock().add_place(place).map_err(FsError::BadRequest)?;
            tracing::info!("intent log: device {} now holds a copy", dev.id());
        }
        Ok(())
    }

    /// Refuses to take away the device that holds the running log's last
    /// copy.
    pub(crate) fn check_log_copy_leaves(&self, dev: &Device) -> Result<()> {
        let Some(log) = &self.intent else {
            return Ok(());
        };
        let log = log.lock();
        if log.has_place(&dev.path) && log.copies() == 1 {
            return Err(FsError::BadRequest(format!(
                "device {} holds the intent log's only copy: add a device with :log=SIZE first \
                 (`cairn device add TARGET CLASS:PATH:SIZE:log=64M`), then remove this one",
                dev.id()
            )));
        }
        Ok(())
    }

    /// A device leaving the pool stops holding a copy of the log.
    pub(crate) fn log_copy_leaves(&self, dev: &Device) {
        if let Some(log) = &self.intent {
            if log.lock().drop_place(&dev.path) {
                tracing::info!("intent log: device {} no longer holds a copy", dev.id());
            }
        }
    }
}
