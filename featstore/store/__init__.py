"""The Zarr feature store: where it lives (a folder or an object-store URL), its locks and leases, the one reading
class (`reader.FeatureStore`, public through `fs.open_store`), the writer (`writer.StoreWriter`, the reader with the
writing methods, for builds, repairs and probes), the integrity rules the reader hands what it opened
(`verification`), the records both share (`summary`, `probes`, `integrity`, `config`) and the repairs a build
makes. Records the networks' anchor descriptions and the image table; computes nothing."""
