"""The column layouts of the data sets (the real ones'), for reader, generator, model and losses."""

#: Particle classes (0: none, else |PDG id|); the target PDG column stores the index.
CLASS_PDG_IDS = (0, 211, 130, 22, 11, 13)

#: Per-hit input features of ``cld_edm_ttbar_hits`` (elemtype 1 = tracker hit, 2 = calorimeter).
HIT_FEATURES = (
    "elemtype",
    "et",
    "eta",
    "sin_phi",
    "cos_phi",
    "energy",
    "position.x",
    "position.y",
    "position.z",
    "time",
    "subdetector",
    "type",
    "system",
    "side",
    "layer",
)

#: Columns that both layouts hold at the same index (the model's encoding serves both).
ETA, SIN_PHI, COS_PHI = 2, 3, 4

#: Features of ``cld_edm_ttbar_pf``'s tracks (elemtype 1) and clusters (2), named "track/cluster".
PF_FEATURES = (
    "elemtype",
    "pt/et",
    "eta",
    "sin_phi",
    "cos_phi",
    "p/energy",
    "chi2/position.x",
    "ndf/position.y",
    "dEdx/position.z",
    "dEdxError/iTheta",
    "radiusOfInnermostHit/energy_ecal",
    "tanLambda/energy_hcal",
    "D0/energy_other",
    "omega/num_hits",
    "Z0/sigma_x",
    "time/sigma_y",
    "-/sigma_z",
)

#: Target columns per hit (or per element); PDG is stored as a class index into CLASS_PDG_IDS.
TARGET_COLUMNS = (
    "PDG",
    "charge",
    "pt",
    "eta",
    "sin_phi",
    "cos_phi",
    "energy",
    "ispu",
    "generatorStatus",
    "simulatorStatus",
    "gp_to_track",
    "gp_to_cluster",
    "jet_idx",
    "particle_number",
)
