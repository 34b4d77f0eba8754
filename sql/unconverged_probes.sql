-- probes that hit their epoch cap before their stopping criterion was met (their predictions may be off-optimum)
CREATE OR REPLACE VIEW unconverged_probes AS
SELECT run_id, fold, anchor, epochs, train_loss, val_loss, val_accuracy
FROM probe_fits
WHERE NOT converged
ORDER BY run_id, fold, anchor;
