-- exit_shares(sim_run, ks, thresholds, combined_thresholds, scope, gate_thresholds) -> (policy, k, theta,
-- exit_anchor, share): the share of images leaving at each anchor (exit_anchor NULL = full depth) per policy.
CREATE OR REPLACE MACRO exit_shares(sim_run, ks := [1, 2, 3, 4],
                                    thresholds := NULL,
                                    combined_thresholds := [0.5, 0.7, 0.9], scope := 'auto',
                                    gate_thresholds := NULL) AS TABLE
SELECT policy, k, theta, exit_anchor, count(*) / sum(count(*)) OVER (PARTITION BY policy, k, theta) AS share
FROM exit_events(sim_run, ks := ks, thresholds := thresholds, combined_thresholds := combined_thresholds,
                 scope := scope, gate_thresholds := gate_thresholds)
GROUP BY policy, k, theta, exit_anchor
ORDER BY policy, k NULLS FIRST, theta NULLS FIRST, exit_anchor NULLS LAST;
