! vlcc.f90 - the Fortran interface of vlcc-adjoint: module vlcc.
!
! The functions of vlcc.h under the same names, as integer functions (0 on
! success, a VLCC_E_ code on error; vlcc_last_error() gives the message),
! taking type(c_ptr) handles and plain Fortran strings (trailing blanks are
! not part of a name, a path or a ref):
!
!     use vlcc
!     type(c_ptr) :: run
!     type(vlcc_action) :: a
!     real(real64), target :: u(nx)
!     ierr = vlcc_run_open(run, '{"schedule": {"kind": "revolve", "steps": 1000, "snapshots": 10}}')
!     ierr = vlcc_run_protect(run, 'u', u)            ! u holds u_0
!     do
!        ierr = vlcc_run_next(run, a)
!        if (ierr /= 0) error stop vlcc_last_error()
!        select case (a%kind)
!        case (VLCC_ADVANCE);  do i = a%from, a%to - 1; call step(u, i); end do
!        case (VLCC_TURN);     lam = u                 ! u holds u_n
!        case (VLCC_REVERSE);  call adjoint_step(u, lam, a%to)
!        case (VLCC_DONE);     exit
!        end select
!     end do
!     ierr = vlcc_run_close(run)
!
! Build with the flags of `python -m vlcc_adjoint.capi --fflags` (after the
! sources on the command line).
!
! vlcc_run_protect and vlcc_history_protect are generic over real(real64),
! real(real32), integer(int32) and integer(int64) arrays of rank 0 to 3.  The
! array must be contiguous and stay where it is from the protect to the close
! (declare it with the target attribute, or allocatable, and do not
! reallocate it meanwhile).  Python sees a Fortran array a(n1, n2, n3) as an
! array of shape (n3, n2, n1): the same memory, in C order.
module vlcc
   use, intrinsic :: iso_c_binding, only: c_ptr, c_null_ptr, c_char, c_null_char, c_int, &
                                          c_int32_t, c_int64_t, c_size_t, c_loc, c_f_pointer, &
                                          c_associated
   use, intrinsic :: iso_fortran_env, only: real32, real64, int32, int64
   implicit none
   private

   public :: vlcc_action
   public :: VLCC_ADVANCE, VLCC_TURN, VLCC_REVERSE, VLCC_DONE
   public :: VLCC_OK, VLCC_E_ARGUMENT, VLCC_E_HANDLE, VLCC_E_STATE, VLCC_E_STORAGE, &
             VLCC_E_CORRUPT, VLCC_E_PYTHON, VLCC_E_INTERNAL, VLCC_VERSION_SIZE
   public :: vlcc_run_open, vlcc_run_protect, vlcc_run_next, vlcc_run_close
   public :: vlcc_history_open, vlcc_history_protect, vlcc_history_commit, &
             vlcc_history_checkout, vlcc_history_close
   public :: vlcc_last_error

   ! The numbers of vlcc.h.
   integer, parameter :: VLCC_ADVANCE = 1, VLCC_TURN = 2, VLCC_REVERSE = 3, VLCC_DONE = 4
   integer, parameter :: VLCC_OK = 0, VLCC_E_ARGUMENT = 1, VLCC_E_HANDLE = 2, &
                         VLCC_E_STATE = 3, VLCC_E_STORAGE = 4, VLCC_E_CORRUPT = 5, &
                         VLCC_E_PYTHON = 6, VLCC_E_INTERNAL = 7
   integer, parameter :: VLCC_VERSION_SIZE = 13

   ! What vlcc_run_next answers: kind, and the steps from and to.
   type, bind(c) :: vlcc_action
      integer(c_int32_t) :: kind
      integer(c_int64_t) :: from
      integer(c_int64_t) :: to
   end type vlcc_action

   interface vlcc_run_protect
      module procedure run_protect_real64, run_protect_real32, &
                       run_protect_int32, run_protect_int64
   end interface vlcc_run_protect

   interface vlcc_history_protect
      module procedure history_protect_real64, history_protect_real32, &
                       history_protect_int32, history_protect_int64
   end interface vlcc_history_protect

   ! The C functions (libvlcc).
   interface
      function c_run_open(run, config) bind(c, name='vlcc_run_open') result(ierr)
         import :: c_ptr, c_char, c_int
         type(c_ptr), intent(out) :: run
         character(kind=c_char), intent(in) :: config(*)
         integer(c_int) :: ierr
      end function c_run_open

      function c_run_protect(run, name, data, dtype, ndim, shape) &
         bind(c, name='vlcc_run_protect') result(ierr)
         import :: c_ptr, c_char, c_int, c_int32_t, c_int64_t
         type(c_ptr), value :: run
         character(kind=c_char), intent(in) :: name(*)
         type(c_ptr), value :: data
         character(kind=c_char), intent(in) :: dtype(*)
         integer(c_int32_t), value :: ndim
         integer(c_int64_t), intent(in) :: shape(*)
         integer(c_int) :: ierr
      end function c_run_protect

      function c_run_next(run, action) bind(c, name='vlcc_run_next') result(ierr)
         import :: c_ptr, c_int, vlcc_action
         type(c_ptr), value :: run
         type(vlcc_action), intent(out) :: action
         integer(c_int) :: ierr
      end function c_run_next

      function c_run_close(run) bind(c, name='vlcc_run_close') result(ierr)
         import :: c_ptr, c_int
         type(c_ptr), value :: run
         integer(c_int) :: ierr
      end function c_run_close

      function c_history_open(h, path, mode) bind(c, name='vlcc_history_open') result(ierr)
         import :: c_ptr, c_char, c_int
         type(c_ptr), intent(out) :: h
         character(kind=c_char), intent(in) :: path(*), mode(*)
         integer(c_int) :: ierr
      end function c_history_open

      function c_history_protect(h, name, data, dtype, ndim, shape) &
         bind(c, name='vlcc_history_protect') result(ierr)
         import :: c_ptr, c_char, c_int, c_int32_t, c_int64_t
         type(c_ptr), value :: h
         character(kind=c_char), intent(in) :: name(*)
         type(c_ptr), value :: data
         character(kind=c_char), intent(in) :: dtype(*)
         integer(c_int32_t), value :: ndim
         integer(c_int64_t), intent(in) :: shape(*)
         integer(c_int) :: ierr
      end function c_history_protect

      function c_history_commit(h, branch, message, version, version_size) &
         bind(c, name='vlcc_history_commit') result(ierr)
         import :: c_ptr, c_char, c_int, c_size_t
         type(c_ptr), value :: h
         character(kind=c_char), intent(in) :: branch(*), message(*)
         character(kind=c_char), intent(out) :: version(*)
         integer(c_size_t), value :: version_size
         integer(c_int) :: ierr
      end function c_history_commit

      function c_history_checkout(h, ref) bind(c, name='vlcc_history_checkout') result(ierr)
         import :: c_ptr, c_char, c_int
         type(c_ptr), value :: h
         character(kind=c_char), intent(in) :: ref(*)
         integer(c_int) :: ierr
      end function c_history_checkout

      function c_history_close(h) bind(c, name='vlcc_history_close') result(ierr)
         import :: c_ptr, c_int
         type(c_ptr), value :: h
         integer(c_int) :: ierr
      end function c_history_close

      function c_last_error() bind(c, name='vlcc_last_error') result(message)
         import :: c_ptr
         type(c_ptr) :: message
      end function c_last_error

      function c_set_last_error(code, message) bind(c, name='vlcc_set_last_error') result(ierr)
         import :: c_int, c_char
         integer(c_int), value :: code
         character(kind=c_char), intent(in) :: message(*)
         integer(c_int) :: ierr
      end function c_set_last_error

      function c_strlen(s) bind(c, name='strlen') result(n)
         import :: c_ptr, c_size_t
         type(c_ptr), value :: s
         integer(c_size_t) :: n
      end function c_strlen
   end interface

contains

   ! `text` without its trailing blanks, NUL-terminated for C.
   pure function c_string(text) result(s)
      character(len=*), intent(in) :: text
      character(kind=c_char, len=len_trim(text) + 1) :: s
      s = trim(text)//c_null_char
   end function c_string

   ! -- runs -------------------------------------------------------------------

   integer function vlcc_run_open(run, config) result(ierr)
      type(c_ptr), intent(out) :: run
      character(len=*), intent(in) :: config
      ierr = c_run_open(run, c_string(config))
   end function vlcc_run_open

   integer function vlcc_run_next(run, action) result(ierr)
      type(c_ptr), intent(in) :: run
      type(vlcc_action), intent(out) :: action
      ierr = c_run_next(run, action)
   end function vlcc_run_next

   integer function vlcc_run_close(run) result(ierr)
      type(c_ptr), intent(inout) :: run
      ierr = c_run_close(run)
      if (ierr == VLCC_OK) run = c_null_ptr
   end function vlcc_run_close

   ! -- histories --------------------------------------------------------------

   integer function vlcc_history_open(h, path, mode) result(ierr)
      type(c_ptr), intent(out) :: h
      character(len=*), intent(in) :: path, mode
      ierr = c_history_open(h, c_string(path), c_string(mode))
   end function vlcc_history_open

   ! Commit the regions on `branch` ('' for the current one); the version's id
   ! goes into `version` (12 characters), blank-padded.
   integer function vlcc_history_commit(h, branch, message, version) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: branch, message
      character(len=*), intent(out) :: version
      character(kind=c_char) :: buffer(len(version) + 1)
      integer :: i
      buffer = c_null_char
      ierr = c_history_commit(h, c_string(branch), c_string(message), buffer, &
                              int(size(buffer), c_size_t))
      version = ' '
      do i = 1, len(version)
         if (buffer(i) == c_null_char) exit
         version(i:i) = buffer(i)
      end do
   end function vlcc_history_commit

   integer function vlcc_history_checkout(h, ref) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: ref
      ierr = c_history_checkout(h, c_string(ref))
   end function vlcc_history_checkout

   integer function vlcc_history_close(h) result(ierr)
      type(c_ptr), intent(inout) :: h
      ierr = c_history_close(h)
      if (ierr == VLCC_OK) h = c_null_ptr
   end function vlcc_history_close

   ! -- errors -----------------------------------------------------------------

   ! The message of this thread's last error ('' if none).
   function vlcc_last_error() result(message)
      character(len=:), allocatable :: message
      type(c_ptr) :: p
      character(kind=c_char), pointer :: chars(:)
      integer :: i, n
      p = c_last_error()
      n = 0
      if (c_associated(p)) n = int(c_strlen(p))
      allocate (character(len=n) :: message)
      if (n == 0) return
      call c_f_pointer(p, chars, [n])
      do i = 1, n
         message(i:i) = chars(i)
      end do
   end function vlcc_last_error

   ! -- protecting arrays ------------------------------------------------------

   ! The region of `array` for C: its address, rank and extents (reversed:
   ! Fortran's first index varies fastest, as C's last), or an error code
   ! (`call` names the function in the message).
   integer function region(call, array, address, ndim, extents) result(ierr)
      character(len=*), intent(in) :: call
      type(*), dimension(..), target, intent(in) :: array
      type(c_ptr), intent(out) :: address
      integer(c_int32_t), intent(out) :: ndim
      integer(c_int64_t), intent(out) :: extents(3)
      integer :: k
      ierr = VLCC_OK
      address = c_null_ptr
      ndim = int(rank(array), c_int32_t)
      extents = 0
      if (rank(array) > 3) then
         ierr = c_set_last_error(VLCC_E_ARGUMENT, c_string(call// &
            ': arrays of rank 0 to 3 are supported; protect a rank-1 pointer to its memory'))
         return
      end if
      if (.not. is_contiguous(array)) then
         ierr = c_set_last_error(VLCC_E_ARGUMENT, c_string(call// &
            ': the array is not contiguous (a section with strides?); protect a contiguous '// &
            'array: the engine reads and writes its memory in place'))
         return
      end if
      do k = 1, rank(array)
         extents(rank(array) - k + 1) = int(size(array, k), c_int64_t)
      end do
      if (size(array) > 0) address = c_loc(array)
   end function region

   ! Protects `array`, of the element type `dtype`, in the run (`is_run`) or the
   ! history `handle` (the specific procedures below name the type).
   integer function protect(is_run, handle, name, array, dtype) result(ierr)
      logical, intent(in) :: is_run
      type(c_ptr), intent(in) :: handle
      character(len=*), intent(in) :: name, dtype
      type(*), dimension(..), target, intent(in) :: array
      type(c_ptr) :: address
      integer(c_int32_t) :: ndim
      integer(c_int64_t) :: extents(3)
      if (is_run) then
         ierr = region('vlcc_run_protect', array, address, ndim, extents)
         if (ierr == VLCC_OK) &
            ierr = c_run_protect(handle, c_string(name), address, c_string(dtype), ndim, extents)
      else
         ierr = region('vlcc_history_protect', array, address, ndim, extents)
         if (ierr == VLCC_OK) &
            ierr = c_history_protect(handle, c_string(name), address, c_string(dtype), ndim, &
                                     extents)
      end if
   end function protect

   ! One specific procedure per type and handle (the generic interfaces above):
   ! Fortran resolves a generic call by the array's type, which protect() then
   ! names; each takes arrays of any rank (assumed rank), region() refuses
   ! ranks above 3.

   integer function run_protect_real64(run, name, array) result(ierr)
      type(c_ptr), intent(in) :: run
      character(len=*), intent(in) :: name
      real(real64), dimension(..), target, intent(inout) :: array
      ierr = protect(.true., run, name, array, 'float64')
   end function run_protect_real64

   integer function run_protect_real32(run, name, array) result(ierr)
      type(c_ptr), intent(in) :: run
      character(len=*), intent(in) :: name
      real(real32), dimension(..), target, intent(inout) :: array
      ierr = protect(.true., run, name, array, 'float32')
   end function run_protect_real32

   integer function run_protect_int32(run, name, array) result(ierr)
      type(c_ptr), intent(in) :: run
      character(len=*), intent(in) :: name
      integer(int32), dimension(..), target, intent(inout) :: array
      ierr = protect(.true., run, name, array, 'int32')
   end function run_protect_int32

   integer function run_protect_int64(run, name, array) result(ierr)
      type(c_ptr), intent(in) :: run
      character(len=*), intent(in) :: name
      integer(int64), dimension(..), target, intent(inout) :: array
      ierr = protect(.true., run, name, array, 'int64')
   end function run_protect_int64

   integer function history_protect_real64(h, name, array) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: name
      real(real64), dimension(..), target, intent(inout) :: array
      ierr = protect(.false., h, name, array, 'float64')
   end function history_protect_real64

   integer function history_protect_real32(h, name, array) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: name
      real(real32), dimension(..), target, intent(inout) :: array
      ierr = protect(.false., h, name, array, 'float32')
   end function history_protect_real32

   integer function history_protect_int32(h, name, array) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: name
      integer(int32), dimension(..), target, intent(inout) :: array
      ierr = protect(.false., h, name, array, 'int32')
   end function history_protect_int32

   integer function history_protect_int64(h, name, array) result(ierr)
      type(c_ptr), intent(in) :: h
      character(len=*), intent(in) :: name
      integer(int64), dimension(..), target, intent(inout) :: array
      ierr = protect(.false., h, name, array, 'int64')
   end function history_protect_int64

end module vlcc
