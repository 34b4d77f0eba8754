"""The Zarr feature store: where it lives (a folder or an object-store URL), its locks and leases, the reader
(`reader.FeatureStore`, public) and the writer (`writer.StoreWriter`, for builds and probes), the integrity check
and the repairs a build makes. Records the networks' anchor descriptions and the image table; computes nothing."""
