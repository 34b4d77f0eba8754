"""The Zarr feature store: where it lives (a folder or an object-store URL), its locks and leases, the reader
(`reader.FeatureStore`, public: its roles composed, each a module: `reading` with the `image_table`, `verification`,
`summary`, `probes`), the writer (`writer.StoreWriter`, for builds and probes), the integrity checksums and the
repairs a build makes. Records the networks' anchor descriptions and the image table; computes nothing."""
