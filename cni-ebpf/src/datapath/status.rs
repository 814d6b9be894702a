//! STATUS: is the datapath of a network usable (bpffs, embedded object, complete pins of
//! our layout)? Works without a [`Datapath`] handle, as STATUS must not load anything.

use super::{load, maps::Maps, object, refuse_foreign, Datapath, Pins};
use crate::{
    cni::config::NetConf,
    error::{Error, Result},
};

impl Datapath {
    /// Whether this network's datapath has never been loaded since bpffs was mounted (the
    /// node booted): no version directory under `<bpffsRoot>/<network>`. The first ADD
    /// loads it. bpffs itself must be usable.
    pub fn never_loaded(conf: &NetConf) -> Result<bool> {
        load::check_bpffs(&conf.bpffs_root)?;
        Ok(!Pins::new(conf.pin_dir()).version_dir().exists())
    }

    /// STATUS: bpffs mounted, object embedded, pins present and of our layout; otherwise
    /// [`Error::NotAvailable`] with the reason.
    pub fn status(conf: &NetConf) -> Result<()> {
        load::check_bpffs(&conf.bpffs_root)?;
        if !object::is_embedded() {
            return Err(Error::NotAvailable(
                "this binary was built without its eBPF programs".into(),
            ));
        }
        let pins = Pins::new(conf.pin_dir());
        refuse_foreign(&pins).map_err(|e| Error::NotAvailable(e.to_string()))?;
        let missing = pins.missing();
        if !missing.is_empty() {
            return Err(Error::NotAvailable(format!(
                "the eBPF datapath of network {} is not loaded (missing {}); run `cni-ebpf load` or ADD a pod",
                conf.name,
                missing
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Maps::open(&pins).map_err(|e| Error::NotAvailable(e.to_string()))?;
        Ok(())
    }
}
