-- exit_simulation(sim_run, sim_device, sim_batch := 1, ks, thresholds, combined_thresholds, scope, gate_thresholds)
-- -> (policy, k, theta, n, accuracy, mean_ms, mean_flops, full_depth_share): each early-exit policy's accuracy
-- and mean cost per image. Exiting at anchor l costs the network prefix up to l plus every probe up to l;
-- reaching full depth costs the whole model plus, for gated policies, all the probes; the 'full depth'
-- baseline runs the model alone. Costs come from anchor_costs/model_costs (featstore cost), per image
-- (batch time / batch size) on the named device.
CREATE OR REPLACE MACRO exit_simulation(sim_run, sim_device, sim_batch := 1, ks := [1, 2, 3, 4],
                                        thresholds := NULL,
                                        combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                        gate_thresholds := NULL) AS TABLE
WITH m AS (SELECT model FROM runs WHERE run_id = sim_run),
costs AS (
    SELECT anchor, (ms + sum(probe_ms) OVER (ORDER BY anchor)) / batch_size AS exit_ms,
           (flops + sum(probe_flops) OVER (ORDER BY anchor)) / batch_size AS exit_flops
    FROM anchor_costs WHERE model = (SELECT model FROM m) AND device = sim_device AND batch_size = sim_batch),
probes AS (
    SELECT sum(probe_ms) / any_value(batch_size) AS ms, sum(probe_flops) / any_value(batch_size) AS flops
    FROM anchor_costs WHERE model = (SELECT model FROM m) AND device = sim_device AND batch_size = sim_batch),
whole AS (
    SELECT ms / batch_size AS ms, flops / batch_size AS flops FROM model_costs
    WHERE model = (SELECT model FROM m) AND device = sim_device AND batch_size = sim_batch),
priced AS (
    SELECT e.*,
           CASE WHEN e.exit_anchor IS NOT NULL THEN c.exit_ms
                WHEN e.policy = 'full depth' THEN whole.ms ELSE whole.ms + probes.ms END AS ms,
           CASE WHEN e.exit_anchor IS NOT NULL THEN c.exit_flops
                WHEN e.policy = 'full depth' THEN whole.flops ELSE whole.flops + probes.flops END AS flops
    FROM exit_events(sim_run, ks := ks, thresholds := thresholds, combined_thresholds := combined_thresholds,
                     scope := scope, gate_thresholds := gate_thresholds) e
    CROSS JOIN whole CROSS JOIN probes LEFT JOIN costs c ON c.anchor = e.exit_anchor)
SELECT policy, k, theta, count(*) AS n, avg((pred = label)::INT) AS accuracy, avg(ms) AS mean_ms,
       avg(flops) AS mean_flops, avg((exit_anchor IS NULL)::INT) AS full_depth_share
FROM priced GROUP BY policy, k, theta
ORDER BY policy, k NULLS FIRST, theta NULLS FIRST;
