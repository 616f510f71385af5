/*
 * cuda-vecadd: adds two vectors on GPU 0 through the CUDA driver API and
 * checks the sum on the CPU. It is the GPU check's proof that a container
 * given the GPU by CDI can compute on it, not only list it.
 *
 * It needs no CUDA toolkit to build or to run: the few driver API types and
 * functions it uses are declared here, libcuda.so.1 (which the CDI spec
 * bind-mounts from the host's driver) is opened with dlopen at run time,
 * and the kernel is PTX text that the driver compiles (JIT) for whatever
 * GPU it finds. PTX ISA 6.0 for sm_50 is understood by every driver since
 * CUDA 9 and JIT-compiles for every later architecture (Hopper included).
 *
 * It is linked dynamically against glibc (the driver libraries need glibc
 * anyway; a static binary cannot dlopen them reliably): the check's image
 * carries the build host's glibc files beside it.
 *
 * Output: "CUDA vector add OK on <device name> (...)" and exit 0, or
 * "cuda-vecadd: <step>: <error>" on stderr and exit 1.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The driver API's types, as cuda.h declares them (64-bit CUdeviceptr
 * since CUDA 3.2: the "_v2" entry points). */
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
	CUDA_SUCCESS = 0,
	CU_JIT_ERROR_LOG_BUFFER = 5,
	CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

/* c[i] = a[i] + b[i] for i < n, one thread per element. */
static const char vecadd_ptx[] =
	".version 6.0\n"
	".target sm_50\n"
	".address_size 64\n"
	"\n"
	".visible .entry vecadd(\n"
	"	.param .u64 vecadd_a,\n"
	"	.param .u64 vecadd_b,\n"
	"	.param .u64 vecadd_c,\n"
	"	.param .u32 vecadd_n\n"
	")\n"
	"{\n"
	"	.reg .pred %p<2>;\n"
	"	.reg .b32 %r<6>;\n"
	"	.reg .f32 %f<4>;\n"
	"	.reg .b64 %rd<11>;\n"
	"\n"
	"	mov.u32 %r1, %ctaid.x;\n"
	"	mov.u32 %r2, %ntid.x;\n"
	"	mov.u32 %r3, %tid.x;\n"
	"	mad.lo.s32 %r4, %r1, %r2, %r3;\n"
	"	ld.param.u32 %r5, [vecadd_n];\n"
	"	setp.ge.u32 %p1, %r4, %r5;\n"
	"	@%p1 bra DONE;\n"
	"	ld.param.u64 %rd1, [vecadd_a];\n"
	"	ld.param.u64 %rd2, [vecadd_b];\n"
	"	ld.param.u64 %rd3, [vecadd_c];\n"
	"	cvta.to.global.u64 %rd4, %rd1;\n"
	"	cvta.to.global.u64 %rd5, %rd2;\n"
	"	cvta.to.global.u64 %rd6, %rd3;\n"
	"	mul.wide.u32 %rd7, %r4, 4;\n"
	"	add.s64 %rd8, %rd4, %rd7;\n"
	"	add.s64 %rd9, %rd5, %rd7;\n"
	"	add.s64 %rd10, %rd6, %rd7;\n"
	"	ld.global.f32 %f1, [%rd8];\n"
	"	ld.global.f32 %f2, [%rd9];\n"
	"	add.rn.f32 %f3, %f1, %f2;\n"
	"	st.global.f32 [%rd10], %f3;\n"
	"DONE:\n"
	"	ret;\n"
	"}\n";

/* The driver functions used, looked up by their exported names. */
static struct {
	CUresult (*Init)(unsigned int);
	CUresult (*DriverGetVersion)(int *);
	CUresult (*DeviceGetCount)(int *);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetName)(char *, int, CUdevice);
	CUresult (*CtxCreate)(CUcontext *, unsigned int, CUdevice);
	CUresult (*CtxDestroy)(CUcontext);
	CUresult (*CtxSynchronize)(void);
	CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned int, int *, void **);
	CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*ModuleUnload)(CUmodule);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
	CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
				 unsigned int, unsigned int, unsigned int, unsigned int,
				 CUstream, void **, void **);
	CUresult (*GetErrorName)(CUresult, const char **);
} cu;

static void fail(const char *step, const char *why)
{
	fprintf(stderr, "cuda-vecadd: %s: %s\n", step, why);
	exit(1);
}

/* check ends the program when a driver call failed, naming the call and
 * the driver's name for the error (CUDA_ERROR_NO_DEVICE, ...). */
static void check(CUresult r, const char *step)
{
	const char *name = NULL;
	char buf[32];

	if (r == CUDA_SUCCESS)
		return;
	if (cu.GetErrorName == NULL || cu.GetErrorName(r, &name) != CUDA_SUCCESS || name == NULL) {
		snprintf(buf, sizeof buf, "CUresult %d", r);
		name = buf;
	}
	fail(step, name);
}

static void *symbol(void *lib, const char *name)
{
	void *p = dlsym(lib, name);

	if (p == NULL)
		fail("dlsym", name);
	return p;
}

static void load_driver(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

	if (lib == NULL)
		fail("cannot load the CUDA driver", dlerror());
	*(void **)&cu.GetErrorName = symbol(lib, "cuGetErrorName");
	*(void **)&cu.Init = symbol(lib, "cuInit");
	*(void **)&cu.DriverGetVersion = symbol(lib, "cuDriverGetVersion");
	*(void **)&cu.DeviceGetCount = symbol(lib, "cuDeviceGetCount");
	*(void **)&cu.DeviceGet = symbol(lib, "cuDeviceGet");
	*(void **)&cu.DeviceGetName = symbol(lib, "cuDeviceGetName");
	*(void **)&cu.CtxCreate = symbol(lib, "cuCtxCreate_v2");
	*(void **)&cu.CtxDestroy = symbol(lib, "cuCtxDestroy_v2");
	*(void **)&cu.CtxSynchronize = symbol(lib, "cuCtxSynchronize");
	*(void **)&cu.ModuleLoadDataEx = symbol(lib, "cuModuleLoadDataEx");
	*(void **)&cu.ModuleGetFunction = symbol(lib, "cuModuleGetFunction");
	*(void **)&cu.ModuleUnload = symbol(lib, "cuModuleUnload");
	*(void **)&cu.MemAlloc = symbol(lib, "cuMemAlloc_v2");
	*(void **)&cu.MemFree = symbol(lib, "cuMemFree_v2");
	*(void **)&cu.MemcpyHtoD = symbol(lib, "cuMemcpyHtoD_v2");
	*(void **)&cu.MemcpyDtoH = symbol(lib, "cuMemcpyDtoH_v2");
	*(void **)&cu.LaunchKernel = symbol(lib, "cuLaunchKernel");
}

/* load_kernel JIT-compiles the PTX; a compile error prints the driver's
 * log, which says what in the PTX it did not accept. */
static CUfunction load_kernel(CUmodule *mod)
{
	static char log[8192];
	int opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void *vals[] = {log, (void *)(size_t)sizeof log};
	CUfunction fn;
	CUresult r = cu.ModuleLoadDataEx(mod, vecadd_ptx, 2, opts, vals);

	if (r != CUDA_SUCCESS) {
		if (log[0] != '\0')
			fprintf(stderr, "cuda-vecadd: PTX JIT log:\n%s\n", log);
		check(r, "cuModuleLoadDataEx");
	}
	check(cu.ModuleGetFunction(&fn, *mod, "vecadd"), "cuModuleGetFunction");
	return fn;
}

int main(void)
{
	enum { N = 1 << 20, THREADS = 256 };
	size_t bytes = N * sizeof(float);
	float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
	CUdeviceptr da, db, dc;
	unsigned int n = N;
	void *args[] = {&da, &db, &dc, &n};
	int version = 0, count = 0, i;
	char name[256] = "";
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;

	if (a == NULL || b == NULL || c == NULL)
		fail("malloc", "out of memory");
	for (i = 0; i < N; i++) {
		a[i] = (float)i;
		b[i] = 2.0f * (float)i + 0.5f;
		c[i] = -1.0f;
	}

	load_driver();
	check(cu.Init(0), "cuInit");
	check(cu.DriverGetVersion(&version), "cuDriverGetVersion");
	check(cu.DeviceGetCount(&count), "cuDeviceGetCount");
	check(cu.DeviceGet(&dev, 0), "cuDeviceGet");
	check(cu.DeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
	printf("CUDA driver API %d.%d, %d device(s); using 0: %s\n", version / 1000, version % 1000 / 10, count, name);

	check(cu.CtxCreate(&ctx, 0, dev), "cuCtxCreate");
	fn = load_kernel(&mod);
	check(cu.MemAlloc(&da, bytes), "cuMemAlloc");
	check(cu.MemAlloc(&db, bytes), "cuMemAlloc");
	check(cu.MemAlloc(&dc, bytes), "cuMemAlloc");
	check(cu.MemcpyHtoD(da, a, bytes), "cuMemcpyHtoD");
	check(cu.MemcpyHtoD(db, b, bytes), "cuMemcpyHtoD");
	check(cu.LaunchKernel(fn, (N + THREADS - 1) / THREADS, 1, 1, THREADS, 1, 1, 0, NULL, args, NULL),
	      "cuLaunchKernel");
	check(cu.CtxSynchronize(), "cuCtxSynchronize");
	check(cu.MemcpyDtoH(c, dc, bytes), "cuMemcpyDtoH");

	/* Every sum is exact in float (below 2^24 with a .5 part). */
	for (i = 0; i < N; i++) {
		if (c[i] != a[i] + b[i]) {
			fprintf(stderr, "cuda-vecadd: c[%d] = %g, want %g\n", i, c[i], a[i] + b[i]);
			return 1;
		}
	}
	check(cu.MemFree(da), "cuMemFree");
	check(cu.MemFree(db), "cuMemFree");
	check(cu.MemFree(dc), "cuMemFree");
	check(cu.ModuleUnload(mod), "cuModuleUnload");
	check(cu.CtxDestroy(ctx), "cuCtxDestroy");
	printf("CUDA vector add OK on %s (%d elements)\n", name, N);
	return 0;
}
