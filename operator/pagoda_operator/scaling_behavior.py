"""How fast an autoscaled variant grows and shrinks: the HorizontalPodAutoscaler behavior that the
operator's own HPA and the one KEDA creates for a ScaledObject share."""

from __future__ import annotations

from pagoda_operator.models import AutoscalingSpec


def behavior(scaling: AutoscalingSpec) -> dict:
    return {
        # A queue means users are waiting now: double (or add 4 pods) every 15 s.
        "scaleUp": {
            "stabilizationWindowSeconds": scaling.scale_up_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        # GPU pods are slow to come back: remove one per minute after a quiet window.
        "scaleDown": {
            "stabilizationWindowSeconds": scaling.scale_down_stabilization_seconds,
            "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
        },
    }
