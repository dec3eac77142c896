package main

import (
	"fmt"
	"log/slog"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// calibrateKernels chooses the CPU kernels by a short measurement, cached
// per CPU model and build (tensor.Calibrate; TANDEM_KERNELS overrides it),
// and logs the choice, AMX's presence and, when the measurement shows it,
// how much faster a Q8_0 model would prefill. It runs before the model
// loads, so that no kernel has run under another set.
func calibrateKernels(log *slog.Logger) (tensor.Calibration, error) {
	c, err := tensor.Calibrate(tensor.EnvCalibrateConfig())
	if err != nil {
		return c, fmt.Errorf("choosing the CPU kernels: %w", err)
	}
	log.Info("CPU kernels chosen", "kernels", c.Set, "quantized", c.QuantText(), "cpuid_default", c.Default, "source", c.Source, "why", c.Summary())
	if amx := tensor.DetectAMX(); amx.Tile {
		log.Info("this CPU has AMX", "amx", amx.String(), "quantized_prefill_on_amx", c.Quant == "amx")
		if amx.Int8 && amx.Permitted {
			if err := tensor.AMXSelfCheck(); err != nil {
				log.Warn("the amx quantized kernels are not used: their results differ from the other kernels' here", "err", err)
			}
		}
		if amx.BF16 && amx.Permitted {
			if err := tensor.AMXBF16SelfCheck(); err != nil {
				log.Warn("the amxbf16 kernel set is not used: its self-check failed here", "err", err)
			}
		}
	}
	if h := c.FormatHint(); h != "" {
		log.Info(h)
	}
	return c, nil
}
