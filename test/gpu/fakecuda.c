/*
 * A fake libcuda.so.1 for the GPU check's dry run (test/gpu/run.sh
 * --dry-run) on a machine without a GPU. It exports the driver API calls
 * cuda-vecadd makes and does their work on the CPU, so that the dry run
 * follows the real run's path end to end: the CDI spec bind-mounts this
 * file where the driver's libcuda.so.1 would be, cuda-vecadd finds it
 * through the spec's LD_LIBRARY_PATH, and cuInit opens the device nodes
 * the spec gave the container, as the real driver does (a container
 * without them gets CUDA_ERROR_NO_DEVICE).
 *
 * The kernel launch checks that the PTX names the vecadd entry and adds
 * the vectors itself: this proves cuda-vecadd's plumbing (argument
 * passing, copies, the result check), not the PTX, which only a real
 * driver compiles.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_PTX = 218,
	CUDA_ERROR_NOT_FOUND = 500,
};

static char module_token, function_token, context_token;

/* can_open says whether the container may open a device node: the device
 * cgroup decides at open (write-only: the fake nodes' numbers need no
 * capability for that). */
static int can_open(const char *path)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

CUresult cuGetErrorName(CUresult r, const char **name)
{
	switch (r) {
	case CUDA_SUCCESS:
		*name = "CUDA_SUCCESS";
		break;
	case CUDA_ERROR_NO_DEVICE:
		*name = "CUDA_ERROR_NO_DEVICE";
		break;
	case CUDA_ERROR_INVALID_PTX:
		*name = "CUDA_ERROR_INVALID_PTX";
		break;
	case CUDA_ERROR_NOT_FOUND:
		*name = "CUDA_ERROR_NOT_FOUND";
		break;
	default:
		*name = "CUDA_ERROR_INVALID_VALUE";
	}
	return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int flags)
{
	(void)flags;
	if (!can_open("/dev/nvidiactl") || !can_open("/dev/nvidia0"))
		return CUDA_ERROR_NO_DEVICE;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v)
{
	*v = 12040;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
	*n = 1;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_VALUE;
	*d = 0;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	(void)d;
	strncpy(name, "Fake GPU (berth dry run)", len);
	return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *c, unsigned int flags, CUdevice d)
{
	(void)flags;
	(void)d;
	*c = &context_token;
	return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext c)
{
	return c == &context_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuCtxSynchronize(void)
{
	return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, int *opts, void **vals)
{
	(void)n;
	(void)opts;
	(void)vals;
	if (strstr(image, ".entry vecadd(") == NULL)
		return CUDA_ERROR_INVALID_PTX;
	*m = &module_token;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
	if (m != &module_token || strcmp(name, "vecadd") != 0)
		return CUDA_ERROR_NOT_FOUND;
	*f = &function_token;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m)
{
	return m == &module_token ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
	void *mem = malloc(bytes);

	if (mem == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*p = (CUdeviceptr)(size_t)mem;
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
	free((void *)(size_t)p);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
	memcpy((void *)(size_t)dst, src, bytes);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
	memcpy(dst, (const void *)(size_t)src, bytes);
	return CUDA_SUCCESS;
}

/* The vecadd kernel's work for every thread the launch asks for. */
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			CUstream s, void **args, void **extra)
{
	const float *a, *b;
	float *c;
	unsigned int n, i, threads;

	(void)shared;
	(void)s;
	if (f != &function_token || args == NULL || extra != NULL || gy != 1 || gz != 1 || by != 1 || bz != 1)
		return CUDA_ERROR_INVALID_VALUE;
	a = (const float *)(size_t)*(CUdeviceptr *)args[0];
	b = (const float *)(size_t)*(CUdeviceptr *)args[1];
	c = (float *)(size_t)*(CUdeviceptr *)args[2];
	n = *(unsigned int *)args[3];
	threads = gx * bx;
	for (i = 0; i < n && i < threads; i++)
		c[i] = a[i] + b[i];
	return CUDA_SUCCESS;
}
