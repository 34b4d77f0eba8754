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
counted AS (  -- per policy and exit anchor: the images leaving there, those judged (a prediction) and those right
    SELECT policy, k, theta, exit_anchor, count(*) AS n, count(pred = label) AS judged,
           count(*) FILTER (WHERE pred = label) AS right_
    FROM exit_events(sim_run, ks := ks, thresholds := thresholds, combined_thresholds := combined_thresholds,
                     scope := scope, gate_thresholds := gate_thresholds)
    GROUP BY policy, k, theta, exit_anchor),
priced AS (
    SELECT e.*,
           CASE WHEN e.exit_anchor IS NOT NULL THEN c.exit_ms
                WHEN e.policy = 'full depth' THEN whole.ms ELSE whole.ms + probes.ms END AS ms,
           CASE WHEN e.exit_anchor IS NOT NULL THEN c.exit_flops
                WHEN e.policy = 'full depth' THEN whole.flops ELSE whole.flops + probes.flops END AS flops
    FROM counted e CROSS JOIN whole CROSS JOIN probes LEFT JOIN costs c ON c.anchor = e.exit_anchor)
-- the means per image from the counts per anchor, summed in anchor order: two policies whose images leave at the
-- same anchors have the same figures to the last bit (a tie on the Pareto front stays a tie), whatever the threads
SELECT policy, k, theta, sum(n)::BIGINT AS n,
       CASE WHEN sum(judged) > 0 THEN sum(right_)::DOUBLE / sum(judged)::DOUBLE END AS accuracy,
       sum(n * ms ORDER BY exit_anchor NULLS LAST) / (sum(n) FILTER (WHERE ms IS NOT NULL))::DOUBLE AS mean_ms,
       sum(n * flops ORDER BY exit_anchor NULLS LAST) / (sum(n) FILTER (WHERE flops IS NOT NULL))::DOUBLE
           AS mean_flops,
       (coalesce(sum(n) FILTER (WHERE exit_anchor IS NULL), 0))::DOUBLE / sum(n)::DOUBLE AS full_depth_share
FROM priced GROUP BY policy, k, theta
ORDER BY policy, k NULLS FIRST, theta NULLS FIRST;
