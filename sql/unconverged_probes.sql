-- probes that hit their epoch cap before their stopping criterion was met (their predictions may be off-optimum);
-- read from the fit record in `info`, so that databases written before these fields existed simply list none
CREATE OR REPLACE VIEW unconverged_probes AS
SELECT run_id, fold, anchor, (info->>'epochs')::INTEGER AS epochs, (info->>'train_loss')::DOUBLE AS train_loss,
       (info->>'val_loss')::DOUBLE AS val_loss, val_accuracy
FROM probe_fits
WHERE info->>'converged' = 'false'
ORDER BY run_id, fold, anchor;
