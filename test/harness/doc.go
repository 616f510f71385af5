// Package harness is the fixture library of berth's privileged integration tests
// and benchmarks. It serves a real registry on loopback (go-containerregistry's
// implementation) with optional auth and fault injection, builds test images from
// Debian's busybox-static, builds and runs berthd on temp folders, and checks that
// nothing half-written is left in berthd's root after a test.
//
// Typical use from a test package:
//
//	func TestMain(m *testing.M) { harness.Main(m, "BERTH_INTEGRATION") }
//
//	func TestPull(t *testing.T) {
//		harness.RequireIntegration(t)
//		reg := harness.NewRegistry(t)
//		img := harness.BusyboxImage(t, harness.ImageSpec{})
//		ref := reg.Push(t, "berth/busybox:1.36", img)
//		d := harness.StartDaemon(t, harness.Options{ConfigTOML: harness.PlainHTTP(reg.Host())})
//		... d.Images.PullImage(ctx, ...) ...
//		harness.AssertNoLeaks(t, d.Root, harness.WantImages(img))
//	}
package harness
