package image

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the image service's Prometheus series: what pulls moved and
// took, how many layers they could reuse, and (read at every scrape) the
// images stored.
type metrics struct {
	pullBytes    prometheus.Counter
	pullDuration *prometheus.HistogramVec
	layers       *prometheus.CounterVec

	images, imageBytes, lazyReadEIO, lazyBroken *prometheus.Desc
}

var pullBuckets = prometheus.ExponentialBuckets(0.01, 3, 12) // 10 ms … ~30 min

func newMetrics(reg prometheus.Registerer, s *Service) *metrics {
	if reg == nil {
		return nil
	}
	x := &metrics{
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "berth_image_pull_bytes_total",
			Help: "Bytes received from registries (manifests, configs and compressed layers).",
		}),
		pullDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_image_pull_duration_seconds",
			Help:    "Duration of image pulls (fetch and unpack, which run as one stream), by result.",
			Buckets: pullBuckets,
		}, []string{"result"}),
		layers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_image_layers_total",
			Help: "Layers pulls and imports needed, by whether they were unpacked, mounted lazily (eStargz, [image] lazy) or reused (already on disk, or unpacked by a concurrent pull).",
		}, []string{"result"}),
		// Counted by the lazy layer server (image/lazyd), since it started.
		lazyReadEIO: prometheus.NewDesc("berth_image_lazy_read_failures_total",
			"Reads of lazily pulled layers that failed with EIO: a chunk the registry did not serve, or that failed its digest. Counted by the lazy layer server since it started.", nil, nil),
		lazyBroken: prometheus.NewDesc("berth_image_lazy_layer_verification_failures_total",
			"Lazily pulled layers whose whole blob, once fetched, did not match its manifest digest or its image config's diff ID: their reads fail with EIO and their images are removed. Counted by the lazy layer server since it started.", nil, nil),
		images:     prometheus.NewDesc("berth_images", "Images stored.", nil, nil),
		imageBytes: prometheus.NewDesc("berth_images_size_bytes", "Unpacked size of all stored images (shared layers counted once per image).", nil, nil),
	}
	reg.MustRegister(x.pullBytes, x.pullDuration, x.layers, &imageCollector{s: s, x: x})
	return x
}

func (x *metrics) pulled(start time.Time, bytes int64, err error) {
	if x == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "failure"
	}
	x.pullBytes.Add(float64(bytes))
	x.pullDuration.WithLabelValues(result).Observe(time.Since(start).Seconds())
}

// layer counts one layer a pull or import needed: "unpacked", "lazy" or "reused".
func (x *metrics) layer(result string) {
	if x != nil {
		x.layers.WithLabelValues(result).Inc()
	}
}

type imageCollector struct {
	s *Service
	x *metrics
}

func (c *imageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.x.images
	ch <- c.x.imageBytes
	ch <- c.x.lazyReadEIO
	ch <- c.x.lazyBroken
}

func (c *imageCollector) Collect(ch chan<- prometheus.Metric) {
	all, err := c.s.List("")
	if err != nil {
		c.s.log.Warn("metrics: list images", "err", err)
		return
	}
	var size uint64
	for _, img := range all {
		size += img.Size
	}
	ch <- prometheus.MustNewConstMetric(c.x.images, prometheus.GaugeValue, float64(len(all)))
	ch <- prometheus.MustNewConstMetric(c.x.imageBytes, prometheus.GaugeValue, float64(size))
	st, _ := c.s.lazyStatus() // zeros when no server runs
	ch <- prometheus.MustNewConstMetric(c.x.lazyReadEIO, prometheus.CounterValue, float64(st.ReadFailures))
	ch <- prometheus.MustNewConstMetric(c.x.lazyBroken, prometheus.CounterValue, float64(st.VerificationFailures))
}
