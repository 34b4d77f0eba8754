-- band_window(band, k) -> INTEGER: the window decision_band's thirds make room for under `band`: 0 for 'paper' (the
-- thirds of T), k for 'window' (the thirds of T - k, never-stable images apart); any other band is an error rather
-- than a silent choice (the same list as featstore.schema.BANDS).
CREATE OR REPLACE MACRO band_window(band, k) AS
    CASE WHEN band = 'paper' THEN 0 WHEN band = 'window' THEN k
         ELSE error('band ''' || band || ''': use paper or window') END;
